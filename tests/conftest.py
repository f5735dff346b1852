pytest_plugins = ["ingest.testing.pytest_plugin"]
