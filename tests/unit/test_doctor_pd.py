"""`corral doctor`'s P/D branch, on metric text the simulator's own NIXL collector writes: transfer
failures and expiries count only when they rise between two readings, stranded blocks only while no
decode engine of the model is routable, no compatible pair from the router's pairs; an aggregated
fleet gets none of it, and the branch reads the engines' /metrics again over real HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from corral.contracts.router import FleetEndpoint, ModelPairs
from corral.fleet.checks.doctor import diagnose
from corral.fleet.checks.doctor_pd import (
    EXPIRED_TRANSFERS,
    NO_PAIR,
    STRANDED_BLOCKS,
    TRANSFER_FAILURES,
    UNPAIRED_PREFILL,
    pd_branch,
    pd_findings,
)
from corral.fleet.checks.probe import EngineView, FleetTarget, FleetView
from corral.fleet.local.ports import free_port
from corral.sim.core.kv_transfer import KvTransfers
from corral.sim.http.kv_metrics import KvTransferCollector

MODEL = "llama"


def nixl_text(kv_role: str, failed: int = 0, expired: int = 0, held: int = 0) -> str:
    """An engine's /metrics as the simulator writes it (vLLM's vllm:nixl_* families)."""
    config = {"kv_connector": "NixlConnector", "kv_role": kv_role}
    kv = KvTransfers(config, "engine-0", scheduler=None, bytes_per_block=1, ms_per_block=1.0)  # type: ignore[arg-type]
    kv.stats.failed_transfers, kv.stats.expired = failed, expired
    kv.held = {f"r{i}": None for i in range(held)}  # type: ignore[misc]
    registry = CollectorRegistry()
    registry.register(KvTransferCollector(MODEL, kv, created=1.0))
    return generate_latest(registry).decode()


def engine(name: str, role: str, text: str, url: str | None = None) -> EngineView:
    return EngineView(
        name,
        f"http://{name}-sup",
        url or f"http://{name}",
        state={"state": "READY", "role": role, "pairing": "aaaa"},
        models=[{"id": MODEL}],
        health=200,
        metrics=text,
    )


def fleet(
    engines: list[EngineView], pairs: list[ModelPairs] | None = None, decode_routable: bool = True
) -> FleetView:
    endpoints = [
        FleetEndpoint(
            url=str(e.engine_url),
            name=e.name,
            role=str((e.state or {})["role"]),
            models=[MODEL],
            routable=decode_routable or (e.state or {})["role"] == "prefill",
        )
        for e in engines
    ]
    return FleetView(
        FleetTarget("http://router", []),
        engines=engines,
        router_endpoints=endpoints,
        router_pairs=pairs if pairs is not None else [],
    )


def branches(found: list[tuple[str, str, str, str]]) -> dict[str, tuple[str, str]]:
    return {branch: (member, evidence) for member, branch, evidence, _ in found}


def test_the_simulators_text_has_the_families_the_branch_reads() -> None:
    text = nixl_text("kv_producer", failed=2, expired=1, held=3)
    assert "vllm:nixl_num_failed_transfers_total" in text
    assert "vllm:nixl_num_kv_expired_reqs_total" in text
    assert "corral_sim_kv_transfers_held" in text


def test_rising_failed_transfers_are_a_branch_a_steady_count_is_not() -> None:
    decode = engine("d0", "decode", nixl_text("kv_consumer", failed=2))
    view = fleet([engine("p0", "prefill", nixl_text("kv_producer")), decode])
    found = branches(pd_findings(view, {"d0": nixl_text("kv_consumer", failed=5)}, 3))
    assert found[TRANSFER_FAILURES] == (
        "d0",
        "decode engine: vllm:nixl_num_failed_transfers_total 2 → 5 within 3s",
    )
    assert pd_findings(view, {"d0": nixl_text("kv_consumer", failed=2)}, 3) == []


def test_rising_expired_transfers_on_a_prefill_engine() -> None:
    prefill = engine("p0", "prefill", nixl_text("kv_producer", expired=1))
    view = fleet([prefill, engine("d0", "decode", nixl_text("kv_consumer"))])
    found = branches(pd_findings(view, {"p0": nixl_text("kv_producer", expired=4)}, 2))
    assert found[EXPIRED_TRANSFERS][0] == "p0"
    assert "vllm:nixl_num_kv_expired_reqs_total 1 → 4 within 2s" in found[EXPIRED_TRANSFERS][1]


def test_stranded_blocks_only_while_no_decode_engine_is_routable() -> None:
    prefill = engine("p0", "prefill", nixl_text("kv_producer", held=3))
    decode = engine("d0", "decode", nixl_text("kv_consumer"))
    later = {"p0": nixl_text("kv_producer", held=3)}
    no_decode = [ModelPairs(model=MODEL, prefill_routable=1, decode_routable=0, pairs=0, why="no decode")]
    found = branches(pd_findings(fleet([prefill, decode], no_decode, decode_routable=False), later, 3))
    assert found[STRANDED_BLOCKS][0] == "p0"
    assert (
        "holds 3 unpulled transfers (corral_sim_kv_transfers_held 3 → 3 over 3s)" in found[STRANDED_BLOCKS][1]
    )
    assert "no decode engine of llama is routable" in found[STRANDED_BLOCKS][1]
    # a decode engine routable: the blocks will be pulled, nothing stranded
    ok = [ModelPairs(model=MODEL, prefill_routable=1, decode_routable=1, pairs=1, why="routable")]
    assert STRANDED_BLOCKS not in branches(pd_findings(fleet([prefill, decode], ok), later, 3))
    # falling: they are being freed
    falling = {"p0": nixl_text("kv_producer", held=1)}
    assert STRANDED_BLOCKS not in branches(
        pd_findings(fleet([prefill, decode], no_decode, False), falling, 3)
    )


def test_no_compatible_pair_and_an_unpaired_prefill_from_the_routers_pairs() -> None:
    engines = [engine("p0", "prefill", ""), engine("d0", "decode", "")]
    why = "prefill p0 has pairing identity bbbb, no routable decode endpoint has it (d0=aaaa)"
    none = [ModelPairs(model=MODEL, prefill_routable=1, decode_routable=1, pairs=0, why=why)]
    member, evidence = branches(pd_findings(fleet(engines, none), {}, 1))[NO_PAIR]
    assert member == "router" and why in evidence
    partial = [
        ModelPairs(model=MODEL, prefill_routable=2, decode_routable=1, pairs=1, unpaired_prefill=["p1"])
    ]
    member, evidence = branches(pd_findings(fleet(engines, partial), {}, 1))[UNPAIRED_PREFILL]
    assert "routable prefill p1 has no compatible decode endpoint" in evidence


def test_an_aggregated_fleet_has_no_pd_branch() -> None:
    view = FleetView(
        FleetTarget("http://router", []),
        engines=[EngineView("e0", None, "http://e0", health=200, metrics=nixl_text("kv_both", failed=1))],
        router_endpoints=[FleetEndpoint(url="http://e0", routable=True)],
    )
    assert asyncio.run(pd_branch(view, 0.01)) == []


def _free_port() -> int:
    return free_port("127.0.0.1")


async def test_doctor_reads_the_engines_metrics_again_over_http() -> None:
    later: dict[str, Any] = {"text": nixl_text("kv_consumer", failed=7)}

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=later["text"])

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        decode = engine("d0", "decode", nixl_text("kv_consumer", failed=1), url=f"http://127.0.0.1:{port}")
        view = fleet([decode])
        found = branches(await pd_branch(view, 0.05))
        assert found[TRANSFER_FAILURES] == (
            "d0",
            "decode engine: vllm:nixl_num_failed_transfers_total 1 → 7 within 0.05s",
        )
        # and `corral doctor`'s diagnosis carries it (the engine answers no token: its own branch)
        diagnosed = [d for d in await diagnose(view, 0.05) if d.branch == TRANSFER_FAILURES]
        assert [d.engine for d in diagnosed] == ["d0"]
    finally:
        await runner.cleanup()
