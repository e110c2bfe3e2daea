"""Watching Kubernetes pods in the informer pattern: `client` lists and watches pods, `informer` keeps
a list+watch running (re-list on 410, broken streams and periodically), `workqueue` separates event
intake from slow work. The router's `discovery/k8s_pods.py` turns the pods into membership events."""
