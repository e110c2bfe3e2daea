"""Routing: which eligible endpoint takes a request. Unscored policies (round robin, least request,
session affinity) and scored ones (the load-bound filter, then weighted scorers: prefix affinity, queue,
KV usage, in flight, LoRA, session), chosen per model in `--policy-config` or per request by header.

Modules, each importing only those above it in this list: `names` (POLICY_NAMES), `request`
(RouteRequest, Policy), `rings` (the one ring cache), `filters` (the load bound), `prompt`, `load_board`,
`policies`, `scorers`, `pipeline` (ScoredPolicy), `config`, `load_scraper` (fills the board),
`selector` (builds every policy by name; the router's one entry point, `Routing`)."""
