"""Scored routing: filters (the load bound), weighted scorers (prefix affinity, queue, KV usage, in
flight, LoRA, session), a pick; chosen per model in the `--policy-config` file or per request by header."""
