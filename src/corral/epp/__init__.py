"""`corral epp`: Corral as the endpoint picker (EPP) of a Gateway API inference gateway. The gateway asks,
over Envoy's external-processing protocol (ext_proc, gRPC), which engine should serve each request; the
answer comes from the router's own core (corral.router.core): its membership, supervisor streams and
acknowledged removals, eligibility, serving groups, P/D pairing and policies."""
