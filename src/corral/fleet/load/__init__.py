"""`corral load`: a bounded demo load against a router (OpenAI chat completions, a share of them
streamed), counting what it sent and each failure by kind, so that a rollout "without dropping a
request" can be watched from a second terminal."""
