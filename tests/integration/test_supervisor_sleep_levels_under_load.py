"""The sleep levels the load test of levels 1 and reload leaves out, each on one of two supervised
engines while a router carries continuous, bounded streamed load: a level-0 pause (modes wait and
keep), a level-0 keep pause with the KV cache released (through `corral sleep --release-kv`), a
level-2 sleep woken with reload, and a sleep whose EXECUTE fails in the worker so that its RECOVER
runs. For each: no client request fails before streaming and no stream breaks; between the router's
acknowledgement of the removal and the next READY the engine admits nothing but the supervisor's
smoke request (engine side, from its /metrics) and answers no client (client side, from the
`system_fingerprint`); the oplog shows the runbook's steps in order; `vllm:engine_sleep_state` and
the `corral_sim_*` memory figures move as VERIFY expects."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from typing import Any

from tests.support.sleep_load import (
    GIB,
    STEPS,
    LoadedFleet,
    evidence,
    finish_op,
    loaded_fleet,
    not_ready_window,
    read_engine,
    run_op,
    served_models,
    sleep_gauge,
    steps,
    window_arrivals,
)

AWAKE = sleep_gauge("awake")


def corral(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_STATE_HOME": tempfile.mkdtemp(prefix="corral-state-")}  # the change record's
    return subprocess.run(
        [sys.executable, "-m", "corral", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def assert_awake_and_resident(fleet: LoadedFleet) -> None:
    reading = read_engine(fleet.victim.engine_url)
    assert reading.sleep_state == AWAKE, reading
    assert reading.scheduler_paused == 0, reading
    figures = reading.figures
    assert (figures.gpu_weights_bytes, figures.gpu_kv_cache_bytes, figures.cpu_backup_bytes) == (
        2 * GIB,
        4 * GIB,
        0,
    ), figures
    assert figures.weights_valid == 1, figures


async def nobody_served_while_asleep(
    fleet: LoadedFleet, sleep_op: dict[str, Any], wake_op: dict[str, Any]
) -> None:
    """Engine side and client side: nothing reached the victim from the router's last ack of the sleep's
    removal until it was READY after the wake, bar the wake's smoke request; while it slept the load
    went on against the other engine."""
    victim = fleet.victim
    assert window_arrivals(victim, fleet.sampler, sleep_op["operation_id"], sleep_op["started"]) <= 1
    last_ack, ready = not_ready_window(victim, sleep_op["operation_id"], sleep_op["started"])
    assert ready > wake_op["started"] > sleep_op["finished"] > last_ack
    assert fleet.sent_between(sleep_op["finished"], wake_op["started"]) > 0, "no load while it slept"
    assert fleet.victim_answered(last_ack, wake_op["started"]) == 0


async def test_level_0_pause_wait_and_keep_then_wake_under_load() -> None:
    async with loaded_fleet() as fleet:
        victim = fleet.victim
        assert_awake_and_resident(fleet)
        rounds = []
        for mode in ("wait", "keep"):
            sleep_op = await asyncio.to_thread(run_op, victim, "/v1/sleep", {"level": 0, "mode": mode})
            body = victim.state()
            assert (body["state"], body["sub_state"], body["sleep"]["level"]) == ("SLEEPING", "level_0", 0)
            asleep = read_engine(victim.engine_url)
            # a pause: scheduling stops, no sleep level is recorded, every allocation stays resident
            assert asleep.sleep_state == sleep_gauge(None), asleep
            assert asleep.scheduler_paused == 1, asleep
            assert (asleep.figures.gpu_weights_bytes, asleep.figures.gpu_kv_cache_bytes) == (2 * GIB, 4 * GIB)
            await fleet.answered_after(sleep_op["finished"], 20)  # the load goes on against the other engine
            wake_op = await asyncio.to_thread(run_op, victim, "/v1/wake", {})
            await fleet.routable("the woken engine routable again")
            await fleet.both_engines_serve_after(wake_op["finished"])
            assert_awake_and_resident(fleet)
            rounds.append((mode, sleep_op, wake_op))

        await fleet.end_load()
        for mode, sleep_op, wake_op in rounds:
            for op in (sleep_op, wake_op):
                assert steps(victim, op["operation_id"]) == [(s, "done") for s in STEPS], (mode, op)
            assert evidence(victim, sleep_op["operation_id"], "drain_policy")["policy"] == mode
            verify = evidence(victim, sleep_op["operation_id"], "verify")
            assert verify["sleep_state"] is None
            assert verify["memory"]["gpu_weights_bytes"] == [2 * GIB, 2 * GIB], verify
            assert verify["memory"]["gpu_kv_cache_bytes"] == [4 * GIB, 4 * GIB], verify
            assert evidence(victim, wake_op["operation_id"], "precheck")["sequence"] == ["wake_up"]
            assert evidence(victim, wake_op["operation_id"], "verify")["figures"]["sleep_state"] == "awake"
            await nobody_served_while_asleep(fleet, sleep_op, wake_op)


async def test_level_0_keep_with_kv_release_then_wake_under_load() -> None:
    async with loaded_fleet() as fleet:
        victim = fleet.victim
        assert_awake_and_resident(fleet)
        slept = await asyncio.to_thread(
            corral,
            "sleep",
            "--supervisor",
            victim.url,
            "--level",
            "0",
            "--mode",
            "keep",
            "--release-kv",
            "--operation-id",
            "kv-release",
        )
        assert slept.returncode == 0, slept
        # the printed answer is the contract: what the person who ran the command reads
        assert "execute: done" in slept.stdout and "kv-release succeeded" in slept.stdout, slept.stdout
        sleep_op = finish_op(victim, "kv-release")
        body = victim.state()
        assert (body["state"], body["sub_state"]) == ("SLEEPING", "level_0")
        assert body["sleep"]["kv_released"] is True and body["sleep"]["mode"] == "keep", body["sleep"]
        asleep = read_engine(victim.engine_url)
        assert asleep.sleep_state == sleep_gauge(None) and asleep.scheduler_paused == 1, asleep
        # the KV cache's GPU memory is gone, the weights stay resident, nothing went to host memory
        assert (
            asleep.figures.gpu_weights_bytes,
            asleep.figures.gpu_kv_cache_bytes,
            asleep.figures.cpu_backup_bytes,
        ) == (2 * GIB, 0, 0), asleep
        await fleet.answered_after(sleep_op["finished"], 20)

        woke = await asyncio.to_thread(
            corral, "wake", "--supervisor", victim.url, "--operation-id", "kv-wake"
        )
        assert woke.returncode == 0 and "kv-wake succeeded" in woke.stdout, woke
        wake_op = finish_op(victim, "kv-wake")
        await fleet.routable("the woken engine routable again")
        await fleet.both_engines_serve_after(wake_op["finished"])
        assert_awake_and_resident(fleet)  # the KV cache is back
        await fleet.end_load()

        for op_id in ("kv-release", "kv-wake"):
            assert steps(victim, op_id) == [(s, "done") for s in STEPS], op_id
        execute = evidence(victim, "kv-release", "execute")
        assert execute["release_kv_cache_memory"] == {"status": "kv_cache_released"}, execute
        verify = evidence(victim, "kv-release", "verify")
        assert verify["memory"]["gpu_kv_cache_bytes"] == [4 * GIB, 0], verify
        assert verify["memory"]["gpu_weights_bytes"] == [2 * GIB, 2 * GIB], verify
        wake_verify = evidence(victim, "kv-wake", "verify")
        assert wake_verify["figures"]["gpu_kv_cache_bytes"] == 4 * GIB, wake_verify
        await nobody_served_while_asleep(fleet, sleep_op, wake_op)


async def test_level_2_sleep_then_wake_with_reload_under_load() -> None:
    async with loaded_fleet() as fleet:
        victim = fleet.victim
        assert_awake_and_resident(fleet)
        models = served_models(victim.engine_url)
        engine_before = victim.state()["engine"]
        sleep_op = await asyncio.to_thread(run_op, victim, "/v1/sleep", {"level": 2, "mode": "wait"})
        body = victim.state()
        assert (body["state"], body["sub_state"], body["sleep"]["level"]) == ("SLEEPING", "level_2", 2)
        asleep = read_engine(victim.engine_url)
        # level 2 discards the weights and the KV cache; nothing is backed up in host memory
        assert asleep.sleep_state == sleep_gauge("discard_all"), asleep
        assert (
            asleep.figures.gpu_weights_bytes,
            asleep.figures.gpu_kv_cache_bytes,
            asleep.figures.cpu_backup_bytes,
        ) == (0, 0, 0), asleep
        await fleet.answered_after(sleep_op["finished"], 20)

        wake_op = await asyncio.to_thread(run_op, victim, "/v1/wake", {"reload": True})
        await fleet.routable("the reloaded engine routable again")
        await fleet.both_engines_serve_after(wake_op["finished"])
        assert_awake_and_resident(fleet)  # weights back and valid (reloaded), KV cache back
        assert served_models(victim.engine_url) == models
        await fleet.end_load()

        for op in (sleep_op, wake_op):
            assert steps(victim, op["operation_id"]) == [(s, "done") for s in STEPS], op
        verify = evidence(victim, sleep_op["operation_id"], "verify")
        assert verify["sleep_state"] == "discard_all"
        assert verify["memory"]["gpu_weights_bytes"] == [2 * GIB, 0], verify
        assert verify["memory"]["cpu_backup_bytes"] == [0, 0], verify
        calls = [next(iter(c)) for c in evidence(victim, wake_op["operation_id"], "execute")["calls"]]
        assert calls == ["wake_up weights", "reload_weights", "wake_up kv_cache", "wake_up"]
        wake_verify = evidence(victim, wake_op["operation_id"], "verify")
        assert wake_verify["figures"]["gpu_weights_bytes"] == 2 * GIB
        assert wake_verify["figures"]["weights_valid"] == 1
        # the same model, from the same engine process, answering clients under the same fingerprint
        assert [wake_verify["model"]] == models == [engine_before["model"]]
        engine_after = victim.state()["engine"]
        assert (engine_after["model"], engine_after["pid"]) == (engine_before["model"], engine_before["pid"])
        assert len(victim.engine_pids()) == 1
        assert fleet.victim_answered(wake_op["finished"], float("inf")) > 0
        await nobody_served_while_asleep(fleet, sleep_op, wake_op)


async def test_a_sleep_that_fails_at_execute_recovers_to_ready_under_load() -> None:
    async with loaded_fleet(victim_sim_args=("--fail-sleep",)) as fleet:
        victim = fleet.victim
        assert_awake_and_resident(fleet)
        op = await asyncio.to_thread(
            run_op, victim, "/v1/sleep", {"level": 1, "mode": "wait", "operation_id": "sleep-fails"}, "failed"
        )
        # the failure is named: the step, the engine call and the engine's own message, and RECOVER's outcome
        error = op["error"]
        assert "sleep failed at execute" in error and "POST /sleep?level=1" in error, error
        assert "--fail-sleep" in error and "recover: awake and READY again" in error, error
        # RECOVER (common.back_to_ready) woke the paused engine, checked it and made it READY again
        body = victim.state()
        assert body["state"] == "READY" and body["sleep"] is None, body
        await fleet.routable("the recovered engine routable again")
        await fleet.both_engines_serve_after(op["finished"])
        assert_awake_and_resident(fleet)  # the sleep never took: awake throughout
        await fleet.end_load()

        assert steps(victim, "sleep-fails") == [
            ("precheck", "done"),
            ("remove_from_routing", "done"),
            ("drain_policy", "done"),
            ("execute", "failed"),
            ("recover", "done"),
        ]
        assert "CUDA error" in evidence(victim, "sleep-fails", "execute")["error"]
        recover = evidence(victim, "sleep-fails", "recover")
        assert recover["failed_step"] == "execute" and recover["outcome"] == "awake and READY again", recover
        assert recover["is_sleeping"] is False and recover["smoke"]["text"], recover
        # never SLEEPING, never FAILED; the same engine process (no restart)
        states = [(t["state"], t["reason"]) for t in victim.transitions()]
        tail = states[[s for s, _ in states].index("DRAINING") :]
        assert [s for s, _ in tail if s in ("SLEEPING", "FAILED")] == [], tail
        assert tail[-1] == ("READY", "sleep abandoned at execute: awake again"), tail
        assert len(victim.engine_pids()) == 1

        # nothing reached the engine from the last ack until RECOVER made it READY, bar its smoke request
        assert window_arrivals(victim, fleet.sampler, "sleep-fails", op["started"]) <= 1
        last_ack, ready = not_ready_window(victim, "sleep-fails", op["started"])
        (failed_at,) = [
            r["time"]
            for r in victim.oplog()
            if r["record"] == "runbook_step" and r["operation_id"] == "sleep-fails" and r["step"] == "execute"
        ]
        assert last_ack < failed_at < ready
        assert fleet.sent_between(last_ack, failed_at) > 0, "no load while the sleep ran"
        assert fleet.victim_answered(last_ack, failed_at) == 0
