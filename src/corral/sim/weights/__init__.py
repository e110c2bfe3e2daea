"""Where the simulator's weights come from: disk or the preload daemon, and the dependencies it needs at
init."""
