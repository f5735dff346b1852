"""The supervisor: group membership, worker lifecycle, batch triggers, offset commits."""
