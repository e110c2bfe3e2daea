"""Kubernetes membership in the informer pattern: `client` lists and watches pods, `informer` keeps
a list+watch running (re-list on 410, broken streams and periodically), `workqueue` separates event
intake from slow work, and `pod_source` turns pods into endpoints."""
