"""The engine supervisor (`corral supervise`): dependency gates, the engine process, the lifecycle
state machine, probes and the management API."""
