"""The callers of `corral.engine` read the real vLLM page through the one table and parser."""

from pathlib import Path

from corral.engine import metric_names as m
from corral.engine.load_sample import parse_load
from corral.fleet.checks.expected_sleep import engine_sleep_state
from corral.fleet.checks.probe import EngineView
from corral.fleet.checks.status_table import in_flight, kv_usage
from corral.router.routing.load_scraper import parse_engine_metrics

REAL = (Path(__file__).parents[1] / "data" / "vllm-samples" / "metrics.body").read_text()


def test_status_reads_in_flight_and_kv_and_the_old_kv_name() -> None:
    view = EngineView("e", None, None, metrics=REAL)
    assert in_flight(view) == "0 run / 0 wait"
    assert kv_usage(view) == "0%"
    old = f'{m.KV_USAGE_BEFORE_RENAME}{{engine="0"}} 0.42\n{m.RUNNING} 3\n{m.RUNNING}{{engine="1"}} 2\n'
    assert kv_usage(EngineView("e", None, None, metrics=old)) == "42%"
    assert in_flight(EngineView("e", None, None, metrics=old)) == "5 run / 0 wait"
    assert kv_usage(EngineView("e", None, None, metrics=None)) == "-"


def test_sleep_state_from_the_real_page() -> None:
    assert engine_sleep_state(EngineView("e", None, None, metrics=REAL)) == "awake"


def test_router_and_supervisor_agree_on_the_real_page() -> None:
    load, sample = parse_engine_metrics(REAL.encode(), 1.0), parse_load(REAL, at=1.0)
    assert (load.running, load.waiting) == (sample.running, sample.waiting)
    assert sample.finished > 0 and sample.generation_tokens > 0
