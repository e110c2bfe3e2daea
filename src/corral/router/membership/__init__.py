"""The endpoints the router may send to: each endpoint's state and the per-model index routing reads."""
