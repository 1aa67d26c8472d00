"""Grafana dashboards as code (grafana-foundation-sdk), generated into the chart as JSON.

``python -m deploy.dashboards`` writes ``helm/esp-retrieval/dashboards/*.json``; ``--check``
exits 1 when the committed JSON drifts. The chart ships them in a ConfigMap labelled for the
Grafana sidecar (``dashboards.enabled``).

Panels are data (:class:`Panel` specs grouped in rows); one builder per panel kind turns a
spec into a foundation-sdk panel. Every query filters on the ``$namespace`` and ``$job``
variables; tests check each one with ``promtool`` and against the metrics a running service
really exports (esp_retrieval/service/metrics.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as gc
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as gm

from deploy.chart import CHART_DIR
from deploy.files import generator_main

DASHBOARDS_DIR = CHART_DIR / "dashboards"
DATASOURCE = gm.DataSourceRef(type_val="prometheus", uid="${datasource}")
#: Label matchers every query carries; "All" means ".*", which also matches an absent label.
SEL = 'namespace=~"$namespace", job=~"$job"'
RATE = "[$__rate_interval]"
STATUS_5XX = 'status=~"5.."'
STATUS_ERRORS = 'status=~"4..|5.."'
IN_EXPERIMENT = 'experiment=~"$experiment"'


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel and its legend."""

    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    """A panel spec: ``kind`` names a builder in :data:`PANEL_BUILDERS`."""

    title: str
    description: str
    targets: tuple[Target, ...]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 12
    height: int = 8


def sel(extra: str = "") -> str:
    """The standard matchers, plus ``extra`` ones."""
    return "{" + SEL + (", " + extra if extra else "") + "}"


def rate(metric: str, extra: str = "") -> str:
    return f"rate({metric}{sel(extra)}{RATE})"


def quantiles(histogram: str, by: tuple[str, ...] = (), extra: str = "") -> tuple[Target, ...]:
    """p50/p95/p99 of a histogram, split by the ``by`` labels."""
    labels = ", ".join(("le", *by))
    legend = " ".join("{{" + label + "}}" for label in by)
    return tuple(
        Target(
            f"histogram_quantile({q}, sum by ({labels}) ({rate(histogram + '_bucket', extra)}))",
            f"p{round(q * 100)} {legend}".strip(),
        )
        for q in (0.5, 0.95, 0.99)
    )


def mean(histogram: str, by: tuple[str, ...] = (), legend: str = "mean") -> Target:
    """Mean observation of a histogram over the rate window (sum / count)."""
    group = f"sum by ({', '.join(by)}) " if by else "sum"
    return Target(
        f"{group}({rate(histogram + '_sum')}) / {group}({rate(histogram + '_count')})",
        legend,
    )


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Overview", (
        Panel("Ready pods", "Pods with a bundle loaded and warmed (esp_ready).",
              (Target(f"sum(esp_ready{sel()})"),), unit="none", kind="stat", width=4, height=4),
        Panel("Documents in index", "Rows of the served index (largest over pods).",
              (Target(f"max(esp_index_documents{sel()})"),), kind="stat", width=4, height=4),
        Panel("Bundle version", "Bundle version, dtype and engine backend; the value is the pods serving it.",
              (Target(f"count by (version, dtype, backend) (esp_bundle_info{sel()} == 1)",
                      "{{version}} {{dtype}} {{backend}}"),),
              unit="none", kind="stat", width=8, height=4),
        Panel("Requests per second", "All HTTP requests.",
              (Target(f"sum({rate('esp_requests_total')})"),), unit="reqps", kind="stat", width=4, height=4),
        Panel("Server error ratio", "Share of requests answered with 5xx.",
              (Target(f"(sum({rate('esp_requests_total', STATUS_5XX)}) or vector(0))"
                      f" / sum({rate('esp_requests_total')})"),),
              unit="percentunit", kind="stat", width=4, height=4),
    )),
    ("Traffic and latency", (
        Panel("Requests by route and status", "HTTP requests per second.",
              (Target(f"sum by (route, status) ({rate('esp_requests_total')})", "{{route}} {{status}}"),),
              unit="reqps"),
        Panel("Errors by status", "4xx (bad requests, 413, 429 overload) and 5xx per second.",
              (Target(f"sum by (status) ({rate('esp_requests_total', STATUS_ERRORS)})", "{{status}}"),),
              unit="reqps"),
        Panel("Latency by route", "p50 / p95 / p99 request latency.",
              quantiles("esp_request_duration_seconds", ("route",)), unit="s", width=24),
    )),
    ("Experiments and weights", (
        Panel("Queries by experiment and arm", "Queries per second served by each A/B arm.",
              (Target(f"sum by (experiment, arm) "
                      f"({rate('esp_experiment_requests_total', IN_EXPERIMENT)})",
                      "{{experiment}} / {{arm}}"),),
              unit="reqps"),
        Panel("Latency by experiment and arm", "p50 / p95 / p99 request latency per A/B arm.",
              quantiles("esp_experiment_request_duration_seconds", ("experiment", "arm"), IN_EXPERIMENT),
              unit="s"),
        Panel("Weights in use per subspace", "Mean and median weight per subspace over the queries served.",
              (mean("esp_weights_requested", ("subspace",), "mean {{subspace}}"),
               Target(f"histogram_quantile(0.5, sum by (le, subspace) "
                      f"({rate('esp_weights_requested_bucket')}))", "median {{subspace}}")),
              width=24),
    )),
    ("Engine", (
        Panel("Engine time by backend", "One exhaustive weighted top-k batch: p50 / p95 / p99.",
              quantiles("esp_engine_duration_seconds", ("backend",)), unit="s"),
        Panel("Query encoding time", "Encoding one batch of query texts: p50 / p95 / p99.",
              quantiles("esp_encode_duration_seconds"), unit="s"),
        Panel("Batch size", "Queries scored together in one engine call.",
              (mean("esp_batch_size"),
               Target(f"histogram_quantile(0.95, sum by (le) ({rate('esp_batch_size_bucket')}))", "p95")),
              ),
        Panel("Queue depth", "Queries waiting for the micro-batcher; past capacity it answers 429.",
              (Target(f"max by (instance) (esp_queue_depth{sel()})", "depth {{instance}}"),
               Target(f"max by (instance) (esp_queue_capacity{sel()})", "capacity {{instance}}")),
              ),
        Panel("Searches refused by reason", "429s of admission per second: in-flight limit, wait "
              "forecast past the latency budget, queue full, shed at dequeue.",
              (Target(f"sum by (reason) ({rate('esp_admission_refusals_total')})", "{{reason}}"),),
              ),
        Panel("In flight and its limit", "Searches admitted (body read) and not yet answered, and "
              "the limit in force (fixed or adapted to the latency objective).",
              (Target(f"max by (instance) (esp_admission_inflight{sel()})", "in flight {{instance}}"),
               Target(f"max by (instance) (esp_admission_limit{sel()})", "limit {{instance}}")),
              ),
        Panel("Event-loop lag", "How late the event loop runs a due callback, sampled at each search.",
              quantiles("esp_event_loop_lag_seconds"),
              ),
    )),
    ("Index and reloads", (
        Panel("Documents in index by pod", "Rows of the served index per pod.",
              (Target(f"max by (instance) (esp_index_documents{sel()})", "{{instance}}"),), width=8),
        Panel("Bundle version by pod", "Which bundle each pod serves (1 while served).",
              (Target(f"max by (instance, version) (esp_bundle_info{sel()})", "{{instance}} {{version}}"),),
              unit="none", width=8),
        Panel("Reloads by result", "Registry (operating points, experiments) and bundle reloads.",
              (Target(f"sum by (result) (increase(esp_registry_reloads_total{sel()}{RATE}))",
                      "registry {{result}}"),
               Target(f"sum by (result) (increase(esp_bundle_reloads_total{sel()}{RATE}))",
                      "bundle {{result}}")),
              unit="none", width=8),
        Panel("Bundle rollout: versions served and pods off the named bundle",
              "Distinct bundle versions served (1 when the fleet agrees; alert ESPBundleVersionsDisagree "
              "after 10 minutes above 1) and pods not serving the bundle the registry file names "
              "(esp_bundle_in_sync 0; alert ESPBundleRolloutStuck), with rollout refusals.",
              (Target(f"count(count by (version) (esp_bundle_info{sel()} == 1))", "versions served"),
               Target(f"count(esp_bundle_in_sync{sel()} == 0) or vector(0)", "pods off the named bundle"),
               Target(f"sum(increase(esp_bundle_rollout_refusals_total{sel()}{RATE}))", "refusals")),
              unit="none", width=24),
    )),
)


def _query(target: Target, ref: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(target.expr).legend_format(target.legend or "__auto").ref_id(ref)


def _common(builder: timeseries.Panel | stat.Panel, spec: Panel) -> None:
    builder.title(spec.title).description(spec.description).unit(spec.unit).datasource(DATASOURCE)
    builder.span(spec.width).height(spec.height)
    for i, target in enumerate(spec.targets):
        builder.with_target(_query(target, chr(ord("A") + i)))


def _timeseries(spec: Panel) -> timeseries.Panel:
    builder = (
        timeseries.Panel().fill_opacity(10).line_width(1)
        .legend(gc.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
                .placement(cm.LegendPlacement.BOTTOM).show_legend(True))
        .tooltip(gc.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
    )
    _common(builder, spec)
    return builder


def _stat(spec: Panel) -> stat.Panel:
    # Name and value when the legend carries information (the bundle version), else the value.
    text_mode = cm.BigValueTextMode.VALUE_AND_NAME if spec.targets[0].legend else cm.BigValueTextMode.VALUE
    builder = (
        stat.Panel().graph_mode(cm.BigValueGraphMode.AREA).text_mode(text_mode)
        .reduce_options(gc.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    _common(builder, spec)
    return builder


PANEL_BUILDERS: dict[str, Callable[[Panel], timeseries.Panel | stat.Panel]] = {
    "timeseries": _timeseries,
    "stat": _stat,
}


def _label_variable(name: str, query: str) -> gd.QueryVariable:
    return (
        gd.QueryVariable(name).label(name).datasource(DATASOURCE).query(query)
        .refresh(gm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(gm.VariableSort.ALPHABETICAL_ASC)
        .include_all(True).all_value(".*").multi(True)
        .current(gm.VariableOption(selected=True, text="All", value="$__all"))
    )


def overview() -> gd.Dashboard:
    """The service dashboard: traffic, latency by arm, engine, queue, weights, index, reloads."""
    board = (
        gd.Dashboard("ESP retrieval")
        .uid("esp-retrieval-overview")
        .description("Embedding Subspace Partitioning retrieval service (metrics from service/metrics.py).")
        .tags(["esp", "retrieval"])
        .editable()
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .with_variable(gd.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(_label_variable("namespace", "label_values(esp_ready, namespace)"))
        .with_variable(_label_variable("job", 'label_values(esp_ready{namespace=~"$namespace"}, job)'))
        .with_variable(_label_variable(
            "experiment", f"label_values(esp_experiment_requests_total{sel()}, experiment)"))
    )
    for title, panels in ROWS:
        board.with_row(gd.Row(title))
        for spec in panels:
            board.with_panel(PANEL_BUILDERS[spec.kind](spec))
    return board


#: file name -> dashboard builder.
DASHBOARDS: dict[str, Callable[[], gd.Dashboard]] = {"esp-retrieval.json": overview}


def build() -> dict[str, str]:
    """File name -> dashboard JSON text (stable: sorted keys, trailing newline)."""
    return {
        name: json.dumps(make().build(), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"
        for name, make in DASHBOARDS.items()
    }


def main(argv: list[str] | None = None) -> int:
    return generator_main("deploy.dashboards", __doc__ or "", DASHBOARDS_DIR, build, "*.json", argv=argv)


if __name__ == "__main__":
    raise SystemExit(main())
