"""maintenance."""
