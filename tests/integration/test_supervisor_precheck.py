"""PRECHECK before every start, with a real supervised `corral sim`: a 30 GiB checkpoint on a declared
24 GiB device, a floating revision and a fingerprint mismatch are refused — FAILED with the reason, the
report in /v1/state and the oplog, and no engine process ever started; the same directory on 80 GiB
reaches READY on the fingerprint PRECHECK authorized; a bundle switch is prechecked too."""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from tests.integration.test_supervisor_support import (
    Supervised,
    http_json,
    kill_leftovers,
    short_tmp_dir,
    sim_command,
)
from tests.support.model_dirs import GIB, make_model_dir
from tests.support.procs import CorralProcess, free_port

HUB_MODEL = "org/hub-model"  # an owner/name: the simulator stands in for a hub model
SIM_DEVICE = ("--max-model-len", "4096", "--served-model-name", "big")


@contextlib.contextmanager
def supervised_sim(
    model: str = "sim-model",
    sim_args: tuple[str, ...] = (),
    sup_args: tuple[str, ...] = (),
    wrap: Callable[[list[str]], list[str]] = lambda cmd: cmd,
    env: dict[str, str] | None = None,
) -> Iterator[Supervised]:
    """A supervised `corral sim` (its command `wrap`ped), waited for on /v1/state (a refused start has
    /livez 503 at once)."""
    port, engine_port = free_port(), free_port()
    state_dir = short_tmp_dir() / "state"
    engine_url = f"http://127.0.0.1:{engine_port}"
    args = ["supervise", "--port", str(port), "--engine-url", engine_url, "--state-dir", str(state_dir)]
    engine = wrap(sim_command(engine_port, *sim_args, model=model))
    proc = CorralProcess([*args, *sup_args, "--", *engine], env=env)
    sup = Supervised(proc, f"http://127.0.0.1:{port}", engine_url, state_dir)
    try:
        proc.wait_http(sup.url + "/v1/state")
        yield sup
    finally:
        pids = sup.engine_pids()
        proc.stop(grace=20)
        kill_leftovers(pids)


def refused_without_an_engine(sup: Supervised, check: str) -> dict[str, Any]:
    """FAILED at PRECHECK by `check`: the state says so, the oplog has the report and no engine_started."""
    body = sup.wait_for("FAILED", lambda b: b.get("state") == "FAILED", 30)
    precheck = body["precheck"]
    assert precheck["outcome"] == "refused", precheck
    refusing = [c for c in precheck["checks"] if c["outcome"] == "refused"]
    assert [c["name"] for c in refusing] == [check], precheck
    assert body["reason"].startswith(f"PRECHECK refused the start: {check}: "), body["reason"]
    records = sup.oplog()
    assert [r["outcome"] for r in records if r["record"] == "precheck"] == ["refused"]
    assert not [r for r in records if r["record"] == "engine_started"]
    phases = [r["sub_state"] for r in sup.transitions()]
    assert "precheck" in phases and "engine_starting" not in phases, phases
    assert psutil.Process(sup.proc.pid).children(recursive=True) == []
    _status, startupz = sup.probe("/startupz")
    assert (
        startupz["precheck"]["outcome"] == "refused" and "evidence" not in startupz["precheck"]["checks"][0]
    )
    return refusing[0]


def test_30_gib_on_a_24_gib_device_is_refused_with_the_arithmetic_and_80_reaches_ready(
    tmp_path: Path,
) -> None:
    model = make_model_dir(tmp_path / "big", weights_bytes=30 * GIB, shards=3)
    sim_args = ("--gpu-memory-gib", "24", *SIM_DEVICE)
    with supervised_sim(str(model), sim_args) as sup:
        budget = refused_without_an_engine(sup, "memory_budget")
        assert "30.00 GiB" in budget["reason"] and "24.00 GiB" in budget["reason"], budget["reason"]
        assert budget["evidence"]["lines"], budget
        assert sup.state()["engine"]["pid"] is None
        # corral status: the phase it ended in, the refusal's reason, the fingerprint it refused
        shown = CorralProcess(["status", "--supervisor", sup.url], env={"COLUMNS": "400"})
        shown.wait_exit(30)
        out = shown.output()
        # the printed answer is the contract: what the person who ran the command reads
        assert "FAILED (gave up)" in out and "PRECHECK refused the start: memory_budget" in out, out
        assert "(PRECHECK refused)" in out, out
    with supervised_sim(str(model), ("--gpu-memory-gib", "80", *SIM_DEVICE)) as sup:
        body = sup.wait_state("READY", 60)
        precheck = body["precheck"]
        assert precheck["outcome"] == "authorized" and precheck["authorized_at"] is not None
        outcomes = {c["name"]: c["outcome"] for c in precheck["checks"]}
        assert outcomes["memory_budget"] == "passed" and outcomes["artifact_identity"] == "passed", outcomes
        # the fingerprint authorized before the start is the one the READY engine has
        assert precheck["fingerprint"] == body["bundle"]["fingerprint"]
        at_ready = [r for r in sup.oplog() if r["record"] == "precheck_identity_at_ready"]
        assert at_ready and at_ready[-1]["matches"] is True, at_ready


def test_a_floating_revision_is_refused_unless_allowed(tmp_path: Path) -> None:
    with supervised_sim(HUB_MODEL) as sup:
        identity = refused_without_an_engine(sup, "artifact_identity")
        assert "floating revision (--revision (none given))" in identity["reason"]
        assert "--allow-floating-revision" in identity["reason"]
    with supervised_sim(HUB_MODEL, sup_args=("--allow-floating-revision",)) as sup:
        body = sup.wait_state("READY", 60)
        assert body["precheck"]["fingerprint"] == body["bundle"]["fingerprint"]
    with supervised_sim(HUB_MODEL, sim_args=("--revision", "main")) as sup:
        identity = refused_without_an_engine(sup, "artifact_identity")
        assert "floating revision (--revision main)" in identity["reason"], identity["reason"]
    commit = "0123456789abcdef0123456789abcdef01234567"
    with supervised_sim(HUB_MODEL, sim_args=("--revision", commit)) as sup:  # pinned: no flag needed
        body = sup.wait_state("READY", 60)
        assert body["bundle"]["command"]["revision"] == commit, body["bundle"]["command"]


def test_a_fingerprint_mismatch_is_refused_and_the_shown_one_is_authorized(tmp_path: Path) -> None:
    with supervised_sim() as sup:
        shown = sup.wait_state("READY", 60)["bundle"]["fingerprint"]
    # the same command on another port: ports are not part of the fingerprint
    with supervised_sim(sup_args=("--expect-fingerprint", "0123456789abcdef")) as sup:
        identity = refused_without_an_engine(sup, "artifact_identity")
        assert (
            "0123456789abcdef" in identity["reason"]
            and identity["evidence"]["fingerprint"] in identity["reason"]
        )
        assert identity["evidence"]["fingerprint"] == shown
    with supervised_sim(sup_args=("--expect-fingerprint", shown)) as sup:
        assert sup.wait_state("READY", 60)["precheck"]["fingerprint"] == shown


def test_a_bundle_switch_is_prechecked_against_the_bundles_fingerprint(tmp_path: Path) -> None:
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(
        'name: pinned\nengine_args: ["--version-string", "0.99.0"]\nfingerprint: 0123456789abcdef\n'
    )
    with supervised_sim(sup_args=("--bundle", str(pinned))) as sup:
        sup.wait_state("READY", 60)
        started_before = len(sup.engine_pids())
        status, op = http_json(sup.url + "/v1/bundle", "POST", {"name": "pinned"})
        assert status == 202, op
        # refused at PRECHECK: no engine of the pinned bundle; RECOVER goes back to the first one
        sup.wait_for(
            "back on initial",
            lambda b: b.get("state") == "READY" and b.get("bundle_name") == "initial" and not b.get("busy"),
            60,
        )
        records = sup.oplog()
        outcomes = [r["outcome"] for r in records if r["record"] == "precheck"]
        assert outcomes == ["authorized", "refused", "authorized"], outcomes
        refusal = next(r for r in records if r["record"] == "precheck" and r["outcome"] == "refused")
        assert "fingerprint: of bundle pinned" in refusal["reason"], refusal["reason"]
        # one engine for the first start and one for the way back: none for the refused bundle
        assert len(sup.engine_pids()) == started_before + 1


def test_an_engine_version_other_than_the_authorized_one_is_evidence_at_ready() -> None:
    # a wrapped command: PRECHECK cannot ask it, so the image tag says 1.0; the engine reports 9.9
    def wrap(cmd: list[str]) -> list[str]:
        return ["sh", "-c", "exec " + shlex.join([*cmd, "--version-string", "9.9"])]

    with supervised_sim(wrap=wrap, env={"CORRAL_IMAGE": "registry.local/vllm:1.0"}) as sup:
        body = sup.wait_state("READY", 60)
        identity = next(c for c in body["precheck"]["checks"] if c["name"] == "artifact_identity")
        assert identity["evidence"]["engine_version"] == "1.0"
        assert identity["evidence"]["version_source"] == "image tag ($CORRAL_IMAGE)"
        at_ready = next(r for r in sup.oplog() if r["record"] == "precheck_identity_at_ready")
        assert at_ready["matches"] is False
        assert (at_ready["authorized_version"], at_ready["engine_version"]) == ("1.0", "9.9")
        assert at_ready["fingerprint"] == body["bundle"]["fingerprint"] != body["precheck"]["fingerprint"]
