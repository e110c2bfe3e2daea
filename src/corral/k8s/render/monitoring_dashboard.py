"""The Corral Grafana dashboard, built with grafana-foundation-sdk (not hand-written JSON), and the
ConfigMap the Grafana sidecar loads it from (label grafana_dashboard: "1")."""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import prometheus, timeseries
from grafana_foundation_sdk.builders.dashboard import Dashboard, DatasourceVariable, Row
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from corral.k8s.render.config import CorralDeployment
from corral.k8s.render.monitoring_queries import PANELS
from corral.k8s.render.parts import Obj, object_labels, object_meta

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


def dashboard(config: CorralDeployment) -> dict[str, Any]:
    """The dashboard as the SDK encodes it: one row per component, one time series per panel."""
    board = (
        Dashboard(f"Corral: {config.name}")
        .uid(f"corral-{config.name}"[:40])
        .tags(["corral", "vllm"])
        .refresh("30s")
        .time("now-1h", "now")
        .with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
    )
    row = ""
    for row_title, title, unit, targets in PANELS:
        if row_title != row:
            board = board.with_row(Row(row_title))
            row = row_title
        panel = timeseries.Panel().title(title).unit(unit).datasource(DATASOURCE)
        for ref, (expr, legend) in zip("ABCDEFGH", targets, strict=False):
            panel = panel.with_target(prometheus.Dataquery().ref_id(ref).expr(expr).legend_format(legend))
        board = board.with_panel(panel)
    encoded: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return encoded


def dashboard_config_map(config: CorralDeployment) -> Obj:
    labels = {
        **config.monitoring.labels,
        **object_labels(config, {}, "monitoring"),
        "grafana_dashboard": "1",
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(config, f"{config.name}-grafana-dashboard", labels),
        "data": {f"corral-{config.name}.json": json.dumps(dashboard(config), indent=1, sort_keys=True)},
    }
