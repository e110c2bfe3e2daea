"""Where endpoints come from: backend URLs, a backends file, Kubernetes pods, supervisor state streams."""
