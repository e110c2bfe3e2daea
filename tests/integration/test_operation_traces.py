"""A runbook operation is a trace, with real processes: a supervised `corral sim` exporting to an OTLP
JSON receiver in the test (`--otlp-traces-endpoint`) is put to sleep by `corral sleep`, and a wake is
refused while it is awake. The operation's change record names the trace; the trace is the operation
(root span) and a child span per step, PRECHECK … POSTCHECK in order, each over its own time with its
evidence as attributes; the refused one is a trace whose PRECHECK failed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.integration.test_runbook_change_record import STEPS, corral, records_of
from tests.integration.test_supervisor_support import supervised
from tests.support.span_sink import SpanSink, attribute, span_sink, span_tree
from tests.support.waits import wait_until

SIM_ARGS = ("--enable-sleep-mode", "--weights-gib", "2", "--kv-cache-gib", "4")
SUP_ARGS = ("--propagation-timeout", "2", "--quiet-period", "0.3")


def trace_of(sink: SpanSink, trace_id: str, spans: int) -> list[dict[str, Any]]:
    def spans_of() -> list[dict[str, Any]]:
        with sink.lock:
            return [span for span in sink.spans if span["traceId"] == trace_id]

    wait_until(lambda: len(spans_of()) >= spans, 20, f"{spans} spans of trace {trace_id}")
    return spans_of()


async def test_a_runbook_operation_is_one_trace_named_in_its_change_record(tmp_path: Path) -> None:
    with span_sink() as sink:
        sup_args = (*SUP_ARGS, "--otlp-traces-endpoint", sink.url)
        with supervised(sim_args=SIM_ARGS, sup_args=sup_args, env={"VLLM_SERVER_DEV_MODE": "1"}) as sup:
            await asyncio.to_thread(sup.wait_state, "READY", 30)
            slept = await asyncio.to_thread(
                corral, tmp_path, "sleep", "--supervisor", sup.url, "--level", "1"
            )
            assert slept.returncode == 0, slept.stdout + slept.stderr
            (record,) = records_of(sup, outcome="succeeded")
            trace_id = record["trace_id"]
            assert isinstance(trace_id, str) and len(trace_id) == 32 and int(trace_id, 16)

            spans = trace_of(sink, trace_id, 1 + len(STEPS))
            (root,) = [span for span in spans if "parentSpanId" not in span]
            keys = ("corral.step.ok", "corral.evidence.state", "corral.evidence.policy")
            print(span_tree(spans, keys))  # docs/tracing.md shows it
            assert root["name"] == f"sleep {record['id']}"
            assert attribute(root, "corral.operation.kind") == "sleep"
            assert attribute(root, "corral.operation.outcome") == "succeeded"
            assert "status" not in root  # not an error
            steps = sorted((s for s in spans if s is not root), key=lambda s: int(s["startTimeUnixNano"]))
            assert [s["name"] for s in steps][: len(STEPS)] == STEPS
            assert all(s["parentSpanId"] == root["spanId"] for s in steps)
            assert all(attribute(s, "corral.step.ok") is True for s in steps)
            for span, step in zip(steps, record["steps"], strict=False):  # each over the record's times
                assert int(span["startTimeUnixNano"]) == int(step["started"] * 1e9)
                assert int(span["endTimeUnixNano"]) >= int(span["startTimeUnixNano"])
            execute = next(s for s in steps if s["name"] == "execute")
            evidence = {a["key"] for a in execute["attributes"] if a["key"].startswith("corral.evidence.")}
            assert evidence, execute  # the step's evidence travels with it

            # asleep already: a second sleep is refused at PRECHECK, and that is a trace too
            again = await asyncio.to_thread(
                corral, tmp_path, "sleep", "--supervisor", sup.url, "--level", "1"
            )
            assert again.returncode != 0
            (refused,) = records_of(sup, outcome="refused")
            spans = trace_of(sink, refused["trace_id"], 2)
            (failed,) = [s for s in spans if "parentSpanId" in s]
            assert failed["name"] == "precheck" and failed["status"]["code"] == 2
            assert attribute(failed, "corral.step.ok") is False
