"""The wire models of every body Corral's own components exchange (supervisor state, watch lines,
acknowledgements, operations, the router's `/v1/fleet`, the `corral up` control API, change records):
one module per API, each a pydantic model that both the server and its clients use."""
