"""python_worker."""
