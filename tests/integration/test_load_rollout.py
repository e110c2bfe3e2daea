"""The tour's claim, as a person sees it: `corral load` (finding the local fleet by its port) runs in
one terminal while `corral rollout` moves the fleet in another; the rollout prints the requests the
router answered during it and how many failed, and the load's own summary says 0 failed."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from tests.integration.test_load_cli import PROGRESS_OK, SUMMARY
from tests.integration.test_rollout import stop_up
from tests.integration.test_up import start_up
from tests.support.procs import CorralProcess
from tests.support.waits import wait_until

REQUESTS_LINE = re.compile(r"^requests during the rollout: (\d+) answered by the router, (\d+) failed ", re.M)


def test_a_rollout_under_corral_load_prints_its_requests_and_the_load_counts_none_failed(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    env = {"XDG_STATE_HOME": str(state)}
    up, url = start_up("--engines", "2", "--group-size", "1", "--sim-arg=--itl-ms=5", state_home=state)
    port = url.rsplit(":", 1)[1]
    load = CorralProcess(["load", "--port", port, "--rate", "20", "--seconds", "300"], env=env)
    try:
        wait_until(lambda: PROGRESS_OK.search(load.output()) is not None, 60, "the load's first ok requests")
        bundle = tmp_path / "v2.yaml"
        bundle.write_text('name: v2\nengine_args: ["--itl-ms", "5", "--version-string", "0.33.1"]\n')
        rollout = CorralProcess(["rollout", "--port", port, "--to", str(bundle)], env=env)
        assert rollout.wait_exit(300) == 0, rollout.output()
        # the printed lines are the contract: the rollout's requests line and the load's summary are what
        # the person in each terminal reads (the claim of the tour)
        found = REQUESTS_LINE.search(rollout.output())
        assert found is not None, rollout.output()
        assert int(found[1]) > 0 and found[2] == "0", found[0]

        load.signal(signal.SIGINT)
        assert load.wait_exit(60) == 0, load.output()
        summary = SUMMARY.search(load.output())
        assert summary is not None and summary[1] == "stopped by Ctrl-C", load.output()
        assert summary[4] == "0" and int(summary[3]) > int(found[1]) // 2, load.output()
    finally:
        load.stop()
        stop_up(up)
