"""Fleet operations: the local fleet (`corral up`) and the process handling it needs."""
