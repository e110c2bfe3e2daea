"""Metrics of the simulated KV connector: vLLM's `vllm:nixl_*` families (names, types, buckets and labels
of kv_connector/v1/nixl/stats.py; only with the NixlConnector, as vLLM) and the sim-only gauges a drain
reads (`corral_sim_kv_transfers_held` on a prefill engine, `corral_sim_kv_pulls_in_flight` on a decode
engine), all read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from corral.engine import metric_names as names
from corral.sim.core.kv_transfer import KvTransfers
from corral.sim.core.stats import Histogram
from corral.sim.http.metrics import histogram_family

NIXL_CONNECTOR = "NixlConnector"


class KvTransferCollector(Collector):
    def __init__(self, model_name: str, kv: KvTransfers, created: float) -> None:
        self._labels = {"engine": "0", "model_name": model_name}
        self._kv = kv
        self._created = created

    def _gauge(self, name: str, doc: str, value: float) -> Metric:
        m = Metric(name, doc, "gauge")
        m.add_sample(name, self._labels, value)
        return m

    def _counter(self, sample: str, doc: str, value: float) -> Metric:
        family = names.family(sample)
        m = Metric(family, doc, "counter")
        m.add_sample(sample, self._labels, value)
        m.add_sample(family + "_created", self._labels, self._created)
        return m

    def _histogram(self, name: str, doc: str, hist: Histogram) -> Metric:
        return histogram_family(name, doc, self._labels, hist)

    def collect(self) -> Iterator[Metric]:
        kv, st = self._kv, self._kv.stats
        yield self._gauge(
            names.SIM_KV_TRANSFERS_HELD,
            "Simulated: requests whose KV blocks this engine holds for a remote decode, not yet pulled.",
            len(kv.held),
        )
        yield self._gauge(
            names.SIM_KV_PULLS_IN_FLIGHT,
            "Simulated: KV pulls from a prefill engine started by this engine and not yet finished.",
            kv.pulls_in_flight,
        )
        if kv.consumes:
            stages = Metric(
                names.KV_FETCH_BY_STAGE,
                "Number of waiting requests by async KV load stage. Stage labels: 'waiting_to_start' = needs "
                "an async KV load that has not started; 'in_progress' = load started and not yet reported "
                "finished; 'completed_waiting' = load finished, request not running yet.",
                "gauge",
            )
            for stage, value in (("waiting_to_start", 0), ("in_progress", kv.pulls_in_flight)):
                stages.add_sample(stages.name, {**self._labels, "stage": stage}, value)
            stages.add_sample(stages.name, {**self._labels, "stage": "completed_waiting"}, 0)
            yield stages
        if kv.connector != NIXL_CONNECTOR:
            return
        yield self._histogram(
            names.NIXL_XFER_TIME, "Histogram of transfer duration for NIXL KV Cache transfers.", st.xfer_time
        )
        yield self._histogram(
            names.NIXL_BYTES_TRANSFERRED,
            "Histogram of bytes transferred per NIXL KV Cache transfers.",
            st.bytes_transferred,
        )
        yield self._histogram(
            names.NIXL_NUM_DESCRIPTORS,
            "Histogram of number of descriptors per NIXL  KV Cache transfers.",
            st.descriptors,
        )
        yield self._counter(
            names.NIXL_FAILED_TRANSFERS,
            "Number of failed NIXL KV Cache transfers, including handshake and notification failures. "
            "NOTE: KV expiry is tracked separately in vllm:nixl_num_kv_expired_reqs.",
            st.failed_transfers,
        )
        yield self._counter(
            names.NIXL_FAILED_NOTIFICATIONS,
            "Number of failed NIXL KV Cache notifications. Retained for compatibility; these failures are "
            "also included in vllm:nixl_num_failed_transfers.",
            0,
        )
        yield self._counter(
            names.NIXL_KV_EXPIRED_REQS,
            "Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance.",
            st.expired,
        )
        yield self._counter(
            names.NIXL_NOTIFICATIONS_AFTER_EXPIRY,
            "Number of completion notifications for requests that were no longer tracked, usually because "
            "their KV lease expired.",
            st.notifications_after_expiry,
        )
