"""What the supervisor checks of the engine and of what it depends on: dependency gates, earned
readiness, stall detection, the bundle fingerprint, the adapter set, the engine's API key."""
