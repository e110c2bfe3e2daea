"""PRECHECK: what must be true before an engine is started (or restarted), each check with its evidence."""
