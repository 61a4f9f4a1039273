"""The quality / wall-clock Pareto front: pure function, and its plot. Quality is higher-is-
better (accuracy; a lower-is-better metric such as perplexity is passed negated)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


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


def plot_front(rows: list[dict], front: list[int], out: Path, metric: str = "accuracy") -> None:
    """The test metric against wall-clock for every finished trial, coloured by K, front
    joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    fig, ax = plt.subplots(figsize=(7, 4.5))
    if rows:
        ks = [float(r.get("sync_period") or 1) for r in rows]
        sc = ax.scatter(
            [r["wall_seconds"] for r in rows],
            [r["peak_test_metric"] for r in rows],
            c=ks,
            cmap="viridis",
            norm=LogNorm(vmin=min(ks), vmax=max(max(ks), 2)),
        )
        fig.colorbar(sc, ax=ax, label="K (sync period)")
        fx = [rows[i]["wall_seconds"] for i in front]
        fy = [rows[i]["peak_test_metric"] for i in front]
        ax.plot(fx, fy, "r--", lw=1, label="Pareto front")
        ax.legend()
    ax.set_xlabel("wall-clock (s)")
    ax.set_ylabel(f"best test {metric}")
    ax.set_title(f"autok sweep: {metric} vs wall-clock")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
