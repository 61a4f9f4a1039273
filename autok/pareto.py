"""The quality / wall-clock Pareto front: pure function, and its plot. Quality is higher-is-
better (accuracy; a lower-is-better metric such as perplexity is passed negated)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """a = (accuracy, seconds) dominates b: no worse in both (higher accuracy, fewer seconds),
    better in one."""
    return a[0] >= b[0] and a[1] <= b[1] and (a[0] > b[0] or a[1] < b[1])


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the non-dominated points, by increasing seconds. O(n log n): sweep by time,
    keep a point when it is more accurate than everything at least as fast."""
    order = sorted(range(len(points)), key=lambda i: (points[i][1], -points[i][0]))
    front, best = [], float("-inf")
    for i in order:
        acc, sec = points[i]
        if acc > best:
            front.append(i)
            best = acc
        elif acc == best and front and points[front[-1]][1] == sec:
            front.append(i)  # an exact duplicate of a front point is not dominated either
    return front


# What a trial's row holds besides its settings (autok/sweep.py's columns).
NOT_SETTINGS = {
    "number", "state", "peak_test_metric", "wall_seconds", "time_to_target", "total_seconds",
    "run_dir", "reason",
}  # fmt: skip
SHORT_NAMES = {"sync_period": "K", "slowmo_beta": "β", "lr": "LR"}
MAX_LISTED = 12  # front trials named in the legend; the rest are in pareto.csv


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def settings_text(row: dict) -> str:
    """A trial's searched settings, briefly: 'K=4, LR=0.12, β=0.3, policy=qsr'."""
    return ", ".join(
        f"{SHORT_NAMES.get(k, k)}={_value(v)}"
        for k, v in row.items()
        if k not in NOT_SETTINGS and v not in (None, "")
    )


def plot_front(rows: list[dict], front: list[int], out: Path, metric: str = "accuracy") -> None:
    """pareto.png. The question: which trials are worth their time, i.e. what is the best
    metric reachable within a wall-clock budget, and which settings reach it? Every finished
    trial is a point (colour: K on a log2 scale; size: the LR, where it varies); the front's
    trials are ringed, numbered with their trial number and named with their settings in the
    legend; the staircase is the front itself: the best metric any trial reached within the
    time on the x axis (flat until a slower trial improves on it, never a diagonal)."""
    import math

    from matplotlib.cm import ScalarMappable
    from matplotlib.lines import Line2D

    from autok.trainer.loop.plots import (
        k_cmap,
        k_colorbar,
        k_norm,
        label_points,
        pyplot,
        save,
        staircase,
    )

    plt = pyplot()
    scale, unit = (100.0, " (%)") if metric == "accuracy" else (1.0, "")
    pct = "%" if metric == "accuracy" else ""
    fig, ax = plt.subplots(figsize=(10, 5.2), layout="constrained")
    ax.set_xlabel("training wall-clock (s): the Pareto objective")
    ax.set_ylabel(f"best test {metric}{unit}")
    ax.set_title(f"autok sweep: which trials are worth their time? ({metric} vs wall-clock)")
    if not rows:
        ax.text(0.5, 0.5, "no finished trial", ha="center", va="center", transform=ax.transAxes)
        save(fig, out)
        return
    xs = [float(r["wall_seconds"]) for r in rows]
    ys = [scale * float(r["peak_test_metric"]) for r in rows]
    ks = [float(r.get("sync_period") or 1) for r in rows]
    norm, cmap = k_norm(ks), k_cmap()
    lrs = [r.get("lr") for r in rows]
    positive = [float(v) for v in lrs if isinstance(v, (int, float)) and v > 0]
    lr_known = len(positive) == len(lrs)
    lo, hi = (min(positive), max(positive)) if lr_known else (1.0, 1.0)

    def size(lr: Any) -> float:  # marker area from the LR, on a log scale
        if not lr_known or hi <= lo:
            return 60.0
        return 25.0 + 125.0 * (math.log(lr) - math.log(lo)) / (math.log(hi) - math.log(lo))

    on_front = set(front)
    rest = [i for i in range(len(rows)) if i not in on_front]
    if rest:
        ax.scatter(
            [xs[i] for i in rest], [ys[i] for i in rest], c=[ks[i] for i in rest], cmap=cmap,
            norm=norm, s=[size(lrs[i]) for i in rest], alpha=0.5, edgecolors="white",
            linewidths=0.5, zorder=2,
        )  # fmt: skip
    order = sorted(front, key=lambda i: xs[i])
    fx, fy = staircase([(xs[i], ys[i]) for i in order], max(xs) * 1.04)
    ax.plot(fx, fy, color="crimson", lw=1.3, zorder=3)
    ax.scatter(
        [xs[i] for i in order], [ys[i] for i in order], c=[ks[i] for i in order], cmap=cmap,
        norm=norm, s=[size(lrs[i]) for i in order], edgecolors="black", linewidths=1.2, zorder=4,
    )  # fmt: skip
    handles: list[Any] = [
        Line2D([], [], color="crimson", lw=1.3, label=f"Pareto front: best {metric} by then")
    ]
    for i in order[:MAX_LISTED]:
        r = rows[i]
        what = f"#{r.get('number', i)}  {settings_text(r)}: {ys[i]:.4g}{pct} in {xs[i]:.1f} s"
        handles.append(
            Line2D(
                [], [], ls="none", marker="o", markersize=7, color=cmap(norm(ks[i])),
                markeredgecolor="black", label=what,
            )
        )  # fmt: skip
    if len(order) > MAX_LISTED:
        handles.append(Line2D([], [], ls="none", label=f"... {len(order) - MAX_LISTED} more"))
    if rest:
        handles.append(
            Line2D([], [], ls="none", marker="o", color="0.75", markeredgecolor="white",
                   label="other finished trials")
        )  # fmt: skip
    if lr_known and hi > lo:
        for lr in (lo, math.sqrt(lo * hi), hi):
            handles.append(
                Line2D([], [], ls="none", marker="o", color="0.6",
                       markersize=math.sqrt(size(lr)), label=f"LR {lr:.3g} (marker size)")
            )  # fmt: skip
    fig.legend(
        handles=handles, loc="outside right upper", title="the front's trials, fastest first",
        alignment="left",
    )  # fmt: skip
    k_colorbar(fig, ScalarMappable(norm=norm, cmap=cmap), ax, ks)
    ax.grid(alpha=0.3)
    numbers = [f"#{rows[i].get('number', i)}" for i in order]
    label_points(
        ax, [(xs[i], ys[i]) for i in order], numbers, lines=[(fx, fy)],
        avoid=[(xs[i], ys[i]) for i in rest],
        radius=math.sqrt(max(size(lr) for lr in lrs)) / 2 + 1,  # scatter sizes are areas (pt²)
    )  # fmt: skip
    save(fig, out)
