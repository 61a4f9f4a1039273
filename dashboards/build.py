"""Writes dashboards/autok.json, the Grafana dashboard of a run (`python -m dashboards.build`;
`--check` exits 1 when the committed file differs from what this writes).

Built with grafana-foundation-sdk, Grafana's own builder library, generated from the schema of
the Grafana release it is versioned for: pinned to 11.1.0, the image docker-compose.yml runs, so
a panel option spelled or placed wrong, or a value outside its enum, fails here instead of being
silently dropped by Grafana (which ignores unknown keys of a dashboard). grafanalib, the other
Python choice, is community-kept, writes an older schema and has no Grafana release to pin to.
The SDK is needed only to regenerate the JSON: the JSON is committed and nothing of autok imports
this module. Not typed by the schema, so kept few and checked by tests/test_prometheus.py: the
override properties (free-form ids), and the Prometheus annotation's own options (titleFormat,
textFormat, tagKeys, useValueForTime), whose entry is a plain dict.

Conventions every query follows (tests/test_prometheus.py checks them against a real
Prometheus):
- `{run_id=~"$run_id"}` on every selector: the run picker at the top.
- Rates use `$__rate_interval` (4 scrape intervals at the least, more when zoomed out), so one
  dashboard suits a 20-second run scraped every second and a day-long one.
- Every rate is gated by `and <the counter itself>`: once the run has ended its target fails to
  scrape, Prometheus marks its series stale, and the gate empties the rate at that instant
  instead of letting it linger for a rate window.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common, units
from grafana_foundation_sdk.models import dashboard as dm

OUT = Path(__file__).resolve().parent / "autok.json"
DS_UID = "prometheus"  # provisioning/datasources/prometheus.yml
DS = dm.DataSourceRef(type_val="prometheus", uid=DS_UID)
RUN = '{run_id=~"$run_id"}'
WINDOW = "$__rate_interval"

# units: Grafana's ids (`suffix:X` and `count:X` are its custom units)
STEPS = "suffix:steps"
SAMPLES_PER_S = "count:samples/s"
COUNT = units.NoUnit  # counters drawn as counts: whole numbers (decimals 0)


def sel(metric: str) -> str:
    return f"{metric}{RUN}"


def rate(metric: str) -> str:
    return f"rate({sel(metric)}[{WINDOW}])"


def live(expr: str, *gates: str) -> str:
    """`expr`, present only while the counters it reads are being scraped."""
    return f"({expr}) and {' and '.join(sel(g) for g in gates)}"


def q(expr: str, legend: str, ref: str, instant: bool = False) -> prometheus.Dataquery:
    d = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DS)
    return d.instant() if instant else d.range()


def prop(id_: str, value: Any) -> dm.DynamicConfigValue:
    return dm.DynamicConfigValue(id_val=id_, value=value)


DASHED = prop("custom.lineStyle", {"fill": "dash", "dash": [10, 10]})
RIGHT = prop("custom.axisPlacement", "right")


def red(color: str = "red") -> dm.DynamicConfigValue:
    return prop("color", {"mode": "fixed", "fixedColor": color})


def graph(
    title: str, description: str, unit: str, *targets: prometheus.Dataquery, axis: str = ""
) -> timeseries.Panel:
    p = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .axis_label(axis)
        .span(12)
        .height(8)
        .line_width(2)
        .fill_opacity(0)
        .show_points(common.VisibilityMode.NEVER)
        .legend(
            cb.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(cb.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI))
    )
    for t in targets:
        p = p.with_target(t)
    return p


def counts(p: timeseries.Panel) -> timeseries.Panel:
    """A cumulative counter: whole numbers, a step at each increment."""
    return p.decimals(0).line_interpolation(common.LineInterpolation.STEP_AFTER).min(0)


def single(
    title: str, description: str, unit: str, target: prometheus.Dataquery, width: int, **kw: Any
) -> stat.Panel:
    p = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(width)
        .height(4)
        .with_target(target)
        .graph_mode(common.BigValueGraphMode.NONE)
        .color_mode(common.BigValueColorMode.NONE)
        .text_mode(kw.pop("text_mode", common.BigValueTextMode.AUTO))
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if "no_value" in kw:
        p = p.no_value(kw.pop("no_value"))
    if "decimals" in kw:
        p = p.decimals(kw.pop("decimals"))
    assert not kw, kw
    return p


AFTER_END = (
    " After the run has ended this shows its last value; 'Running for' says whether it still runs."
)
GONE_AFTER_END = (
    " Empty once the run has ended: the rate is gated on the counter still being scraped."
)

STATS = [
    single(
        "Running for",
        "Time since the run's metrics exporter started (rank 0, before the first step). "
        "'not running' once Prometheus fails to scrape it: the run has ended, or not started. "
        "Every rate on this dashboard goes empty at the same instant.",
        units.DurationInHoursMinutesSeconds,
        q(f"time() - {sel('autok_start_time_seconds')}", "{{run_id}}", "A", instant=True),
        4,
        no_value="not running",
    ),
    single(
        "Epoch",
        "The epoch being trained, counted from 1 (autok_epoch + 1)." + AFTER_END,
        units.NoUnit,
        q(f"{sel('autok_epoch')} + 1", "{{run_id}}", "A"),
        3,
        decimals=0,
    ),
    single(
        "K",
        "K, the optimizer steps between parameter averagings, of the last boundary interval "
        "(autok_sync_period)." + AFTER_END,
        STEPS,
        q(sel("autok_sync_period"), "{{run_id}}", "A"),
        3,
        decimals=0,
    ),
    single(
        "Exposed-sync share",
        "Exposed sync / (compute + exposed sync) of the last boundary interval, and the target "
        "the policy keeps it under by raising K (--target-sync-share; exposed-sync and "
        "composite only)." + AFTER_END,
        units.PercentUnit,
        q(sel("autok_sync_share_ratio"), "share", "A"),
        4,
        text_mode=common.BigValueTextMode.VALUE_AND_NAME,
    ).with_target(q(sel("autok_target_sync_share_ratio"), "target", "B")),
    single(
        "Test metric",
        "The task's test metric after the last finished epoch (its name in the metric label: "
        "accuracy on a classification, or a --task's own, e.g. perplexity)." + AFTER_END,
        units.NoUnit,
        q(sel("autok_test_metric"), "{{metric}}", "A"),
        3,
        text_mode=common.BigValueTextMode.VALUE_AND_NAME,
        no_value="after epoch 1",
    ).override_by_name("accuracy", [prop("unit", units.PercentUnit)]),
    single(
        "Throughput",
        "Training samples per second, all ranks, over the last rate window. 'not running' "
        "once the run has ended (an instant query, gated on the counter still being scraped).",
        SAMPLES_PER_S,
        q(live(rate("autok_samples_total"), "autok_samples_total"), "{{run_id}}", "A", True),
        3,
        no_value="not running",
    ),
    single(
        "Link",
        "The emulated link of the run (--link): profile, round-trip time, bandwidth, jitter.",
        units.NoUnit,
        q(
            sel("autok_link_info"),
            "{{profile}}: {{rtt_ms}} ms RTT, {{bandwidth_gbps}} Gbit/s, {{jitter_ms}} ms jitter",
            "A",
        ),
        4,
        text_mode=common.BigValueTextMode.NAME,
    ),
]

share_window = live(
    f"{rate('autok_exposed_sync_seconds_sum')} / ({rate('autok_exposed_sync_seconds_sum')} + "
    f"{rate('autok_compute_seconds_sum')})",
    "autok_exposed_sync_seconds_sum",
)
GRAPHS = [
    graph(
        "K (sync period) and learning rate",
        "K of each boundary interval as a step series (it steps when an interval at the new K "
        "ends), the K the policy chose for the next interval (dashed: it steps at the decision), "
        "and the learning rate (right axis). The orange markers are the K changes, at the "
        "instant of each decision, with old K, new K and the reason.",
        STEPS,
        q(sel("autok_sync_period"), "K {{run_id}}", "A"),
        q(sel("autok_next_sync_period"), "next K {{run_id}}", "B"),
        q(sel("autok_learning_rate"), "LR {{run_id}}", "C"),
        axis="K",
    )
    .line_interpolation(common.LineInterpolation.STEP_AFTER)
    .min(0)
    .override_by_regexp("^next K.*", [DASHED])
    .override_by_regexp(
        "^LR.*",
        [
            RIGHT,
            prop("unit", units.NoUnit),
            prop("custom.axisLabel", "learning rate"),
            prop("custom.lineInterpolation", "linear"),
        ],
    ),
    graph(
        "Exposed-sync share vs target",
        "The share of wall time spent waiting on synchronization: of the last boundary interval "
        "(autok_sync_share_ratio), and over the rate window from the histogram sums (smoother). "
        "The dashed red line is the target the policy steers to (exposed-sync and composite)."
        + GONE_AFTER_END.replace("the rate is", "the windowed share is"),
        units.PercentUnit,
        q(sel("autok_sync_share_ratio"), "last interval {{run_id}}", "A"),
        q(share_window, "window {{run_id}}", "B"),
        q(sel("autok_target_sync_share_ratio"), "target {{run_id}}", "C"),
        axis="share of wall time",
    )
    .min(0)
    .max(1)
    .override_by_regexp("^target.*", [DASHED, red(), prop("custom.lineWidth", 2)]),
    graph(
        "Exposed sync vs compute per boundary",
        "Mean seconds of compute and of exposed (not hidden) sync per boundary interval over "
        "the rate window, and the 90th percentile of exposed sync from the histogram buckets."
        + GONE_AFTER_END,
        units.Seconds,
        q(
            live(
                f"{rate('autok_exposed_sync_seconds_sum')} / "
                f"{rate('autok_exposed_sync_seconds_count')}",
                "autok_exposed_sync_seconds_count",
            ),
            "exposed sync {{run_id}}",
            "A",
        ),
        q(
            live(
                f"{rate('autok_compute_seconds_sum')} / {rate('autok_compute_seconds_count')}",
                "autok_compute_seconds_count",
            ),
            "compute {{run_id}}",
            "B",
        ),
        q(
            "histogram_quantile(0.9, sum by (le, run_id) "
            f"({rate('autok_exposed_sync_seconds_bucket')})) and on (run_id) "
            f"{sel('autok_exposed_sync_seconds_count')}",
            "exposed sync p90 {{run_id}}",
            "C",
        ),
        axis="seconds per boundary",
    ).min(0),
    graph(
        "Drift",
        "At each boundary, before the averaging: drift norm sqrt(mean_i ||theta_i - "
        "theta_avg||^2) and update norm ||theta_avg - theta_ref|| (left, parameter-space "
        "norms), and their ratio (right), which the guard caps (docs/design.md §4); with "
        "--fragments, one line per fragment (label fragment; whole: the whole model).",
        units.NoUnit,
        q(sel("autok_drift_norm"), "drift norm {{run_id}} {{fragment}}", "A"),
        q(sel("autok_update_norm"), "update norm {{run_id}} {{fragment}}", "B"),
        q(sel("autok_drift_ratio"), "drift ratio {{run_id}} {{fragment}}", "C"),
        axis="norm",
    )
    .min(0)
    .override_by_regexp("^drift ratio.*", [RIGHT, prop("custom.axisLabel", "ratio")]),
    graph(
        "Loss and test metric",
        "Mean training loss over each boundary interval and the ranks (left), and the task's "
        "test metric after each epoch (right; a percentage when it is accuracy).",
        units.NoUnit,
        q(sel("autok_train_loss"), "train loss {{run_id}}", "A"),
        q(sel("autok_test_metric"), "test {{metric}} {{run_id}}", "B"),
        axis="loss",
    )
    .override_by_regexp(
        "^test .*",
        [
            RIGHT,
            prop("custom.axisLabel", "test metric"),
            prop("custom.lineInterpolation", "stepAfter"),
        ],
    )
    # after the general "^test" override, so that it wins for accuracy
    .override_by_regexp("^test accuracy .*", [prop("unit", units.PercentUnit)]),
    graph(
        "Throughput",
        "Training samples per second, all ranks, over the rate window." + GONE_AFTER_END,
        SAMPLES_PER_S,
        q(live(rate("autok_samples_total"), "autok_samples_total"), "{{run_id}}", "A"),
        axis="samples/s",
    ).min(0),
    counts(
        graph(
            "Sync events (cumulative)",
            "Counts since the start of the run: boundaries, parameter averagings and gradient "
            "AllReduces (all ranks together count once). Whole numbers; the slope is the rate.",
            COUNT,
            q(sel("autok_boundaries_total"), "boundaries {{run_id}}", "A"),
            q(sel("autok_param_syncs_total"), "parameter averagings {{run_id}}", "B"),
            q(sel("autok_grad_syncs_total"), "gradient AllReduces {{run_id}}", "C"),
            axis="events",
        )
    ),
    counts(
        graph(
            "K changes by reason (cumulative)",
            "How many times the policy changed K since the start of the run, by kind of reason "
            "(raise, back_off, qsr, ...). The end of warmup is not a decision and is not "
            "counted here; it is marked on the K panel.",
            COUNT,
            q(
                f"sum by (run_id, reason) ({sel('autok_sync_period_changes_total')})",
                "{{reason}} {{run_id}}",
                "A",
            ),
            axis="changes",
        )
    ),
    graph(
        "Bytes communicated per second",
        "Payload bytes of the collectives per second, per rank (each rank sends this much)."
        + GONE_AFTER_END,
        units.BytesPerSecondSI,
        q(
            live(rate("autok_communicated_bytes_total"), "autok_communicated_bytes_total"),
            "{{run_id}}",
            "A",
        ),
        axis="bytes/s per rank",
    ).min(0),
    graph(
        "Per-rank wait share (stragglers)",
        "Each rank's own exposed-sync wait / (wait + compute) over the rate window, served by "
        "every rank on PORT + rank with --metrics-per-rank (empty without it). A rank that "
        "waits less than the others is the straggler they wait for." + GONE_AFTER_END,
        units.PercentUnit,
        q(
            live(
                f"{rate('autok_rank_wait_seconds_total')} / "
                f"({rate('autok_rank_wait_seconds_total')} + "
                f"{rate('autok_rank_compute_seconds_total')})",
                "autok_rank_wait_seconds_total",
            ),
            "rank {{rank}} {{run_id}}",
            "A",
        ),
        axis="share of wall time",
    )
    .min(0)
    .max(1),
]

# Grafana's Prometheus annotation, with the series value as the time: one series per change,
# its value the change's unix time (x 1000: Grafana wants milliseconds), so each change is a
# marker at its own instant, labelled with old K, new K and reason, however coarse the scrape.
# last_over_time keeps a change visible to every evaluation step up to 1 h (Grafana widens the
# step on long ranges); all samples of a series carry the same time, so they make one marker.
K_CHANGES = f"last_over_time({sel('autok_sync_period_change_timestamp_seconds')}[1h]) * 1000"
K_ANNOTATION: dict[str, Any] = {
    "name": "K changes",
    "datasource": {"type": "prometheus", "uid": DS_UID},
    "enable": True,
    "hide": False,
    "iconColor": "orange",
    # Grafana 11.1 reads expr/step; later releases move them into `target` (both given)
    "expr": K_CHANGES,
    "step": "15s",
    "target": {"refId": "Anno", "expr": K_CHANGES, "interval": "15s"},
    "titleFormat": "K {{old_k}} → {{new_k}}",
    "textFormat": "{{reason}} (run {{run_id}}, change {{change}})",
    "tagKeys": "reason",
    "useValueForTime": True,
}


def build() -> dict[str, Any]:
    d = (
        db.Dashboard("autok: CPDP training")
        .uid("autok")
        .description(
            "One autok training run (or several, picked by run) as Prometheus scrapes it: "
            "K and the exposed-sync share against its target, time per boundary, drift, loss, "
            "throughput, communication. K changes are marked at their instants."
        )
        .tags(["autok"])
        .time("now-15m", "now")
        .refresh("5s")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .with_variable(
            db.QueryVariable("run_id")
            .label("run")
            .description("The run's output directory name (autok train --out).")
            .datasource(DS)
            .query("label_values(autok_start_time_seconds, run_id)")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_DESC)
            .include_all(True)
            .multi(True)
            .all_value(".*")
            .current(dm.VariableOption(text="All", value="$__all"))
        )
        .annotation(
            db.AnnotationQuery()
            .name("Annotations & Alerts")
            .datasource(dm.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .type("dashboard")
            .built_in(1)
        )
    )
    for panel in [*STATS, *GRAPHS]:
        d = d.with_panel(panel)
    out = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    for i, panel in enumerate(out["panels"], 1):
        panel["id"] = i
    out["annotations"]["list"].append(K_ANNOTATION)
    return out


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv == ["--check"]:
        if OUT.read_text() != text:
            print(f"{OUT} is stale: run python -m dashboards.build", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
