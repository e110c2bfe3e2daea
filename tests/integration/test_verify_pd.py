"""`corral verify` and `corral doctor` against a real prefill/decode fleet (`corral up --prefill 1
--decode 1`): verify's pairs check passes with the routable pair and doctor finds nothing; once the
decode engine is drained out of routing, verify's pairs check fails naming why and doctor reports the
P/D branch `pd/no-compatible-pair` with the router's reason."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import orjson

from tests.integration.test_verify import failed_checks, local_fleet_file_under, start_up, stop, verify
from tests.support.procs import CorralProcess
from tests.support.waits import wait_until


def doctor(port: str, state_home: Path) -> tuple[int, str]:
    proc = CorralProcess(
        ["doctor", "--port", port, "--probe-seconds", "0.5"],
        env={"XDG_STATE_HOME": str(state_home), "COLUMNS": "200"},
    )
    return proc.wait_exit(60), proc.output()


def pairs_line(out: str) -> str:
    return next(line for line in out.splitlines() if re.search(r"\bpairs\b", line))


def test_pairs_pass_on_a_pd_fleet_and_fail_once_its_decode_engine_leaves(tmp_path: Path) -> None:
    up, url = start_up("--prefill", "1", "--decode", "1", state_home=tmp_path)
    port = url.rsplit(":", 1)[1]
    try:
        fleet = orjson.loads(local_fleet_file_under(tmp_path, int(port)).read_bytes())
        roles = {e["role"]: e for e in fleet["engines"]}
        assert set(roles) == {"prefill", "decode"}, fleet["engines"]

        def one_pair() -> bool:
            body = httpx.get(url + "/v1/fleet", timeout=5).json()
            return any(p["pairs"] >= 1 for p in body.get("pairs") or [])

        wait_until(one_pair, 30, "a routable prefill/decode pair")
        code, out = verify("--port", port, "--expect-model", "sim-model", state_home=tmp_path)
        assert "pairs" not in failed_checks(out), out
        assert "1 prefill × 1 decode routable, 1 compatible pairs" in out, out
        code, out = doctor(port, tmp_path)
        assert code == 0, out
        assert "pd/" not in out, out

        token = Path(fleet["supervisor_token_file"]).read_text().strip()
        decode = roles["decode"]["supervisor"]
        drained = httpx.post(
            decode + "/v1/drain", json={}, headers={"Authorization": f"Bearer {token}"}, timeout=10
        )
        assert drained.status_code in (200, 202), drained.text
        wait_until(lambda: not one_pair(), 30, "the pair to leave routing")

        code, out = verify("--port", port, "--expect-model", "sim-model", state_home=tmp_path)
        assert code != 0
        assert "pairs" in failed_checks(out), out
        assert "no complete compatible pair is routable (no routable decode endpoint serves sim-model)" in out
        code, out = doctor(port, tmp_path)
        assert code == 1
        assert "branch router: pd/no-compatible-pair" in out, out
    finally:
        stop(up)
