"""One engine's lifecycle: the state machine, the engine process, dependency gates, readiness, stall,
preload, the drain."""
