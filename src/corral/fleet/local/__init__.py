"""The local fleet behind `corral up`: its processes, its control API, and who owns its files."""
