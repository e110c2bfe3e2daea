"""`corral rollout` and `corral rollback`: moving a fleet to another bundle, group by group or host by
host."""
