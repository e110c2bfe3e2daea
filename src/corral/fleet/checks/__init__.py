"""Looking at a fleet: `corral status`, `corral verify`, `corral doctor`, the probe they share, change
records."""
