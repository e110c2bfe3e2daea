"""The router's per-endpoint traffic figures: the recorder's rules (warmup kept apart and re-armed
when the endpoint becomes routable again, token-carrying chunks as TTFT and gaps), and, through the
router app in front of fake engines on loopback, which endpoint each failure is counted against
(`/v1/fleet` `traffic` and `totals`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from corral.contracts.router import RouterFleet
from corral.contracts.traffic import LATENCY_BOUNDS, TrafficFigures
from corral.router.membership.endpoint import Endpoint
from corral.router.telemetry.endpoint_series import endpoint_series
from corral.router.telemetry.metrics import TTFT_BUCKETS, Histogram
from corral.router.telemetry.traffic import EndpointTraffic, StreamTimes
from tests.support.prom import sample
from tests.unit.test_router_proxy import CHAT, MODEL, Fleet, fleet_of

# -- the recorder -------------------------------------------------------------------------------


def test_first_ttft_since_routable_is_the_warmup_and_stays_out_of_the_steady_histogram() -> None:
    t = EndpointTraffic()
    t.first_token(0.8, dispatched_at=10.0, routable_from=9.0)
    t.first_token(0.02, dispatched_at=10.5, routable_from=9.0)
    t.first_token(0.03, dispatched_at=11.0, routable_from=9.0)
    figures = t.figures()
    assert figures.warmup_ttft_s == 0.8
    assert figures.ttft.count == 2 and abs(figures.ttft.sum - 0.05) < 1e-9
    assert figures.ttft.quantile(1.0) is not None and figures.ttft.quantile(1.0) <= 0.03


def test_warmup_is_re_armed_each_time_the_endpoint_becomes_routable_again() -> None:
    t = EndpointTraffic()
    t.first_token(0.5, dispatched_at=1.0, routable_from=0.0)
    t.first_token(0.01, dispatched_at=2.0, routable_from=0.0)
    # woken (or back from an ejection) at 100: its next first request is a warmup again
    t.first_token(0.9, dispatched_at=100.5, routable_from=100.0)
    t.first_token(0.02, dispatched_at=101.0, routable_from=100.0)
    assert t.warmup_ttft_s == 0.9
    assert t.ttft.count == 2


def test_a_request_dispatched_before_the_endpoint_became_routable_again_is_not_its_warmup() -> None:
    # in flight across an ejection: it answers after routable_from moved, but it was sent before
    t = EndpointTraffic()
    t.first_token(0.4, dispatched_at=5.0, routable_from=7.0)
    assert t.warmup_ttft_s is None and t.ttft.count == 1
    t.first_token(0.6, dispatched_at=7.5, routable_from=7.0)
    assert t.warmup_ttft_s == 0.6 and t.ttft.count == 1


def test_errors_count_among_the_requests() -> None:
    t = EndpointTraffic()
    for failed in (False, True, False, True, True):
        t.ended(failed)
    assert (t.requests, t.errors) == (5, 3)


def test_a_new_endpoint_arms_its_warmup_from_the_slow_start_seam() -> None:
    endpoint = Endpoint("http://e:1", frozenset({MODEL}))
    dispatched = time.monotonic()
    assert dispatched >= endpoint.routable_from
    endpoint.traffic.first_token(0.3, dispatched, endpoint.routable_from)
    assert endpoint.traffic.warmup_ttft_s == 0.3


def test_a_wake_and_a_return_from_ejection_re_arm_the_warmup_through_the_endpoint() -> None:
    from corral.engine_state import EngineState

    endpoint = Endpoint("http://e:1", frozenset({MODEL}), EngineState.READY, "ready")
    traffic = endpoint.traffic

    def answered(seconds: float) -> None:
        traffic.first_token(seconds, time.monotonic(), endpoint.routable_from)

    answered(0.5)
    answered(0.01)
    endpoint.set_state(EngineState.SLEEPING, "slept")
    endpoint.set_state(EngineState.READY, "woken")
    answered(0.7)  # the first since the wake
    answered(0.02)
    assert (traffic.warmup_ttft_s, traffic.ttft.count) == (0.7, 2)
    endpoint.eject(time.monotonic(), base_seconds=0.0)  # back at once: routable_from moved to now
    answered(0.9)
    assert (traffic.warmup_ttft_s, traffic.ttft.count) == (0.9, 2)


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def test_stream_ttft_is_the_first_token_carrying_chunk_and_later_chunks_are_gaps() -> None:
    from corral.engine.stream_ending import StreamEnding

    t = EndpointTraffic()
    ending = StreamEnding()
    times = StreamTimes(t, dispatched=time.monotonic(), routable_from=time.monotonic() + 3600)
    chunks = [
        _event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}),  # the role: no token
        _event({"choices": [{"index": 0, "delta": {"content": "a"}}]}),  # first token
        _event({"choices": [{"index": 0, "delta": {"content": "b"}}]}),
        _event({"choices": [{"index": 0, "delta": {"content": "c"}, "finish_reason": "stop"}]}),
        _event({"choices": [], "usage": {"completion_tokens": 3}}),  # usage only: no gap
        b"data: [DONE]\n\n",  # the terminator: no gap
    ]
    for i, chunk in enumerate(chunks):
        ending.feed(chunk)
        times.feed(chunk, ending.tokens_emitted)
        if i == 0:
            assert t.ttft.count == 0  # the role chunk carries no token
    assert t.ttft.count == 1 and t.warmup_ttft_s is None  # dispatched before routable_from: steady
    assert t.itl.count == 2


def test_figures_are_a_traffic_figures_body_on_the_default_bounds() -> None:
    t = EndpointTraffic()
    t.ended(False)
    t.first_token(0.002, dispatched_at=0.0, routable_from=1.0)
    t.gap(0.004)
    body = t.to_json()
    parsed = TrafficFigures.model_validate(body)
    assert parsed.ttft.bounds is None and parsed.ttft.bucket_bounds() == LATENCY_BOUNDS
    assert parsed.ttft.counts[-1] == 1 and len(parsed.ttft.counts) == LATENCY_BOUNDS.index(0.002) + 1
    assert parsed.itl.count == 1 and parsed.requests == 1 and parsed.errors == 0
    assert TrafficFigures.model_validate(orjson.loads(orjson.dumps(body))) == t.figures()


def test_a_fine_histogram_folds_exactly_into_the_coarse_ttft_buckets() -> None:
    values = [0.0004, 0.001, 0.0011, 0.0025, 0.003, 0.04, 0.05, 0.051, 0.7, 1.0, 2.6, 29.0, 30.0, 31.0, 400.0]
    fine, coarse = Histogram(LATENCY_BOUNDS), Histogram(TTFT_BUCKETS)
    for value in values:
        fine.observe(value)
        coarse.observe(value)
    assert fine.folded(TTFT_BUCKETS) == coarse.cumulative()


def test_folding_into_a_bound_the_histogram_lacks_is_refused() -> None:
    try:
        Histogram(LATENCY_BOUNDS).folded((0.0011,))
    except ValueError as exc:
        assert "0.0011" in str(exc)
    else:
        raise AssertionError("folded into a bound that is not one of the histogram's")


def test_the_endpoint_series_read_back_as_prometheus_client_would_have_written_them() -> None:
    odd = Endpoint('http://e:1/a"b\\c', frozenset({MODEL}))  # a quote and a backslash to escape
    plain = Endpoint("http://e:2", frozenset({MODEL}))
    for value in (0.0004, 0.003, 0.003, 0.7, 31.0):
        odd.traffic.ended(failed=False)
        odd.traffic.first_token(value, dispatched_at=0.0, routable_from=1.0)
    odd.traffic.ended(failed=True)
    odd.traffic.first_token(0.25, dispatched_at=2.0, routable_from=1.0)  # the warmup
    families = {f.name: f for f in text_string_to_metric_families(endpoint_series([odd, plain]).decode())}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples
    }

    def at(name: str, url: str = odd.url, **labels: str) -> float:
        return samples[(name, tuple(sorted({"endpoint": url, **labels}.items())))]

    assert families["corral_router_endpoint_requests"].type == "counter"
    assert families["corral_router_endpoint_ttft_seconds"].type == "histogram"
    assert at("corral_router_endpoint_requests_total", outcome="ok") == 5
    assert at("corral_router_endpoint_requests_total", outcome="error") == 1
    expected = Histogram(TTFT_BUCKETS)
    for value in (0.0004, 0.003, 0.003, 0.7, 31.0):
        expected.observe(value)
    for le, running in expected.cumulative():
        assert at("corral_router_endpoint_ttft_seconds_bucket", le=le) == running, le
    assert at("corral_router_endpoint_ttft_seconds_count") == 5
    assert abs(at("corral_router_endpoint_ttft_seconds_sum") - 31.7064) < 1e-9
    assert at("corral_router_endpoint_warmup_ttft_seconds") == 0.25
    assert at("corral_router_endpoint_ttft_seconds_count", plain.url) == 0
    assert at("corral_router_endpoint_requests_total", plain.url, outcome="ok") == 0
    assert ("corral_router_endpoint_warmup_ttft_seconds", (("endpoint", plain.url),)) not in samples


# -- through the router -------------------------------------------------------------------------


async def _fleet(f: Fleet) -> RouterFleet:
    async with f.client.get(f.url + "/v1/fleet") as resp:
        return RouterFleet.from_body(await resp.json())


def _traffic(fleet: RouterFleet, url: str) -> TrafficFigures:
    figures = fleet.by_url()[url].traffic
    assert figures is not None
    return figures


async def _reset(request: web.Request) -> web.StreamResponse:
    assert request.transport is not None
    request.transport.abort()  # no byte answered: the router retries elsewhere
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


async def test_a_retried_request_is_one_error_on_the_first_endpoint_and_one_ok_on_the_second() -> None:
    async with fleet_of(2, policy="round_robin", eject_seconds=60.0) as f:
        broken, healthy = f.engines
        broken.behaviour = _reset
        statuses = [(await f.post(CHAT))[0] for _ in range(4)]
        assert statuses == [200] * 4
        assert broken.posts == 1  # ejected after its one failure
        fleet = await _fleet(f)
        bad, good = _traffic(fleet, broken.url), _traffic(fleet, healthy.url)
        assert (bad.requests, bad.errors) == (1, 1)
        assert (good.requests, good.errors) == (4, 0)
        assert bad.ttft.count == 0 and bad.warmup_ttft_s is None
        assert good.warmup_ttft_s is not None and good.ttft.count == 3
        assert fleet.totals is not None
        assert (fleet.totals.requests, fleet.totals.errors, fleet.totals.stream_failures) == (4, 0, 0)

        async with f.client.get(f.url + "/metrics") as resp:
            text = await resp.text()
        requests = "corral_router_endpoint_requests_total"
        assert sample(text, requests, endpoint=broken.url, outcome="error") == 1
        assert sample(text, requests, endpoint=broken.url, outcome="ok") == 0
        assert sample(text, requests, endpoint=healthy.url, outcome="ok") == 4
        assert sample(text, requests, endpoint=healthy.url, outcome="error") == 0
        assert sample(text, "corral_router_endpoint_ttft_seconds_count", endpoint=healthy.url) == 3
        assert sample(text, "corral_router_endpoint_ttft_seconds_count", endpoint=broken.url) == 0
        warmup = "corral_router_endpoint_warmup_ttft_seconds"
        seen = sample(text, warmup, endpoint=healthy.url)
        assert seen is not None and good.warmup_ttft_s is not None
        assert abs(seen - good.warmup_ttft_s) <= 1e-6  # /v1/fleet rounds to the microsecond
        assert sample(text, warmup, endpoint=broken.url) is None


async def test_engine_5xx_stream_cut_and_abort_count_against_their_endpoint_and_4xx_does_not() -> None:
    async with fleet_of(1, eject_seconds=0.1) as f:
        (engine,) = f.engines

        async def failing(request: web.Request) -> web.Response:
            return web.json_response({"error": {"message": "boom", "code": 500}}, status=500)

        async def aborting(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(_event({"choices": [{"index": 0, "text": "a", "finish_reason": None}]}))
            await resp.write(_event({"choices": [{"index": 0, "text": "", "finish_reason": "abort"}]}))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp

        async def tokens(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for text in ("a", "b", "c"):
                await resp.write(_event({"choices": [{"index": 0, "text": text}]}))
                await asyncio.sleep(0.01)  # separate chunks at the router
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp

        cases = [
            (engine.bad_request, False),
            (failing, True),
            (engine.cut_after_first_chunk, True),
            (aborting, True),
            (tokens, False),
            (tokens, False),
        ]
        for behaviour, _ in cases:
            engine.behaviour = behaviour
            await f.post({**CHAT, "stream": True})
            for _ in range(100):  # a cut ejects the endpoint; the next case needs it back
                if (await f.fleet())[0]["routable"]:
                    break
                await asyncio.sleep(0.05)
        fleet = await _fleet(f)
        figures = _traffic(fleet, engine.url)
        assert (figures.requests, figures.errors) == (len(cases), sum(failed for _, failed in cases))
        # TTFT: the aborted stream carried a token, and the two good ones; the cut one did not. The
        # cut ejected the endpoint, so the aborted stream, first after its return, is the warmup.
        assert figures.warmup_ttft_s is not None and figures.ttft.count == 2
        assert figures.itl.count >= 2  # the good streams' later tokens
        assert fleet.totals is not None and fleet.totals.requests == len(cases)
        assert fleet.totals.errors == 2  # the 500 and the cut (metrics.errors counts both)
        assert fleet.totals.stream_failures == 2  # the cut and the abort
