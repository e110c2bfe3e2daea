"""One rank of `corral sim preload` (`python -m corral.sim.weights.daemon_rank CONFIG_JSON`), started by
`corral.sim.weights.daemon_launcher` as vLLM's launcher starts `_run_daemon` per GPU."""

from __future__ import annotations

import sys

import orjson

from corral import aio
from corral.sim.weights.preload import DaemonConfig, WeightCacheDaemon


def main(argv: list[str]) -> int:
    config = DaemonConfig(**orjson.loads(argv[1]))
    return aio.run(WeightCacheDaemon(config).run())


if __name__ == "__main__":
    sys.exit(main(sys.argv))
