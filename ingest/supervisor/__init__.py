"""The supervisor: group membership, worker lifecycle, batch triggers, offset commits.

``wiring.py`` turns the config into each layer's settings; ``engine/`` is the main loop
(``runtime.Engine``: workers, batches, releases, retries, backpressure, maintenance);
``modes/`` plugs in where partitions come from (``ingest run``'s group with its offset
commits, ``ingest replay``); ``output/`` is what operators see (status, progress, the
terminal, metrics). Inside it, ``wiring`` <- ``output`` <- ``engine`` <- ``modes``.
"""
