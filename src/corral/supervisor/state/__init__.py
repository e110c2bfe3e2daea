"""What the supervisor keeps on disk: the operation log, runtime adapters, and what a failed write does."""
