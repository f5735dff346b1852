"""recordbatch."""
