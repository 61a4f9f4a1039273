"""What every PNG autok writes shares (k_lr.png here; the report's plots; the sweep's
pareto.png): type readable at 100 dpi (8 pt and up), K on a log2 axis labelled with whole
numbers, the Pareto front drawn as the staircase it is, point labels placed so that they do
not overlap, and one colour family per method. The geometry is in pure functions (staircase,
k_ticks, place_labels, family_colors), so tests need no figure for it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # matplotlib loads only when a plot is drawn
    from matplotlib.typing import RcKeyType

DPI = 100
MIN_FONT_PT = 8  # nothing smaller: at 100 dpi a 6 pt label is 8 pixels high
FONT: dict[RcKeyType, Any] = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.title_fontsize": 8,
    "figure.titlesize": 10,
}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "p")


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display) with autok's type sizes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(FONT)
    return plt


def save(fig, path: Path) -> Path:
    """`path` replaced whole by the figure, never written through a link (atomic_write)."""
    from autok.trainer.loop.atomic_write import replacing

    try:
        with replacing(path, "wb") as f:
            fig.savefig(f, format=path.suffix.lstrip(".") or "png", dpi=DPI)
    finally:
        pyplot().close(fig)
    return path


# ----- K: a power of 2, shown as one ------------------------------------------------------------


def k_ticks(ks: Sequence[float]) -> list[int]:
    """Whole-number ticks for K on a log2 scale: the powers of 2 spanning `ks` (at least two),
    every other one when there would be more than 8."""
    lo, hi = max(1.0, min(ks)), max(1.0, max(ks))
    a, b = math.floor(math.log2(lo) + 1e-9), math.ceil(math.log2(hi) - 1e-9)
    b = max(b, a + 1)
    exps = list(range(a, b + 1))
    if len(exps) > 8:
        exps = exps[::2] if exps[-1] in exps[::2] else [*exps[::2], exps[-1]]
    return [2**e for e in exps]


def k_axis(ax, ks: Sequence[float], which: str = "y") -> None:
    """K on a log2 axis whose labels are whole numbers (1, 2, 4, ...): no 1.5 or 2.5."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ticks = k_ticks(ks)
    getattr(ax, f"set_{which}scale")("log", base=2)
    axis = ax.yaxis if which == "y" else ax.xaxis
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_minor_locator(NullLocator())
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.0f}"))
    getattr(ax, f"set_{which}lim")(ticks[0] / 1.3, ticks[-1] * 1.3)


def k_cmap():
    """viridis without its palest yellow, which vanishes on a white page."""
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap

    return ListedColormap(
        colormaps["viridis"]([0.88 * i / 255 for i in range(256)]), name="autok_k"
    )


def k_norm(ks: Sequence[float]):
    """Colour by log2 K, so K = 2, 4, 8 are evenly spaced colours."""
    from matplotlib.colors import LogNorm

    ticks = k_ticks(ks)
    return LogNorm(vmin=ticks[0], vmax=ticks[-1])


def k_colorbar(fig, mappable, ax, ks: Sequence[float], label: str = "K (sync period)"):
    cb = fig.colorbar(mappable, ax=ax, label=label, pad=0.02)
    cb.set_ticks(k_ticks(ks))
    cb.set_ticklabels([str(t) for t in k_ticks(ks)])
    cb.minorticks_off()
    return cb


# ----- the Pareto front as a staircase -------------------------------------------------------


def staircase(
    front: Sequence[tuple[float, float]], right: float | None = None
) -> tuple[list[float], list[float]]:
    """The vertices of a quality-time Pareto front drawn as what it means: the best quality
    reachable within each time budget. `front`: (seconds, quality) of the front's points; the
    line holds a point's quality flat until the next slower point improves on it, then steps
    (never a diagonal, which would promise qualities no run reached), and on to `right`."""
    pts = sorted(front)
    xs: list[float] = []
    ys: list[float] = []
    for x, y in pts:
        if ys:  # flat at the previous quality up to this point's time
            xs.append(x)
            ys.append(ys[-1])
        xs.append(x)
        ys.append(y)
    if pts and right is not None and right > pts[-1][0]:
        xs.append(right)
        ys.append(pts[-1][1])
    return xs, ys


# ----- labels that do not overlap ------------------------------------------------------------

Box = tuple[float, float, float, float]  # x0, y0, x1, y1


def _overlap(a: Box, b: Box) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


def _outside(box: Box, bounds: Box) -> float:
    inside = _overlap(box, bounds)
    return (box[2] - box[0]) * (box[3] - box[1]) - inside


def place_labels(
    points: Sequence[tuple[float, float]],
    sizes: Sequence[tuple[float, float]],
    radius: float,
    bounds: Box,
    markers: Sequence[tuple[float, float]] | None = None,
    lines: Sequence[tuple[float, float]] = (),
) -> list[Box]:
    """A box for each label (`sizes`: width, height) beside its point, all in points on the
    page: the first of 24 places around the point (three rings, nearest first) that overlaps no
    marker (a square of half-side `radius` around every point of `markers`, default `points`),
    no label placed before and stays inside `bounds`; failing that, the place that overlaps
    least. `lines`: points along drawn lines, each a small obstacle (half-side 1). Greedy and
    deterministic."""
    markers = points if markers is None else markers
    obstacles: list[Box] = [(x - radius, y - radius, x + radius, y + radius) for x, y in markers]
    obstacles += [(x - 1, y - 1, x + 1, y + 1) for x, y in lines]
    placed: list[Box] = []
    for (x, y), (w, h) in zip(points, sizes, strict=True):
        best, best_cost = (x + radius, y - h / 2, x + radius + w, y + h / 2), math.inf
        for ring in range(3):
            r = radius + 1.5 + ring * (h + 1)
            d = r * 0.75
            for x0, y0 in (
                (x + r, y - h / 2),  # right
                (x - w / 2, y + r),  # above
                (x - r - w, y - h / 2),  # left
                (x - w / 2, y - r - h),  # below
                (x + d, y + d),  # upper right
                (x - d - w, y + d),  # upper left
                (x + d, y - d - h),  # lower right
                (x - d - w, y - d - h),  # lower left
            ):
                box = (x0, y0, x0 + w, y0 + h)
                cost = sum(_overlap(box, o) for o in (*obstacles, *placed))
                cost += 4 * _outside(box, bounds)
                if cost < best_cost - 1e-9:
                    best, best_cost = box, cost
                if best_cost == 0:
                    break
            if best_cost == 0:
                break
        placed.append(best)
    return placed


def clusters(points: Sequence[tuple[float, float]], within: float) -> list[list[int]]:
    """Indices of points closer than `within` to one another (single linkage), in order: points
    drawn on top of each other get one label ("6,7"), never two stacked ones."""
    groups: list[list[int]] = []
    for i, (x, y) in enumerate(points):
        near = [
            g
            for g in groups
            if any(math.hypot(x - points[j][0], y - points[j][1]) < within for j in g)
        ]
        merged = [j for g in near for j in g] + [i]
        groups = [g for g in groups if g not in near] + [sorted(merged)]
    return sorted(groups)


def label_points(
    ax,
    xy: Sequence[tuple[float, float]],
    texts: Sequence[str],
    fontsize: float = MIN_FONT_PT,
    lines: Sequence[tuple[Sequence[float], Sequence[float]]] = (),
    avoid: Sequence[tuple[float, float]] = (),
    radius: float = 4.5,
) -> None:
    """Write `texts` beside the data points `xy` of `ax` without overlaps (place_labels), and
    off the polylines `lines` ((xs, ys) in data coordinates, e.g. a Pareto staircase) and the
    unlabelled markers at `avoid` (data coordinates); `radius`: the largest marker's, in
    points. Call it
    last, when everything else of the figure is drawn: it runs the layout to know where the
    points are on the page. Points within a few points of each other share one label."""
    fig = ax.figure
    fig.canvas.draw()  # runs the layout: the axes' place on the page is final from here
    ax.set_xlim(ax.get_xlim())
    ax.set_ylim(ax.get_ylim())
    to_pt = 72.0 / fig.dpi
    shown = [i for i, (x, y) in enumerate(xy) if math.isfinite(x) and math.isfinite(y)]
    xy, texts = [xy[i] for i in shown], [texts[i] for i in shown]
    page = [tuple(p * to_pt for p in ax.transData.transform(q)) for q in xy]
    groups = clusters(page, within=4.0)
    anchors = [page[g[0]] for g in groups]
    words = [",".join(texts[i] for i in g) for g in groups]
    sizes = [(0.62 * fontsize * len(t) + 2, fontsize * 1.15) for t in words]
    bb = ax.get_window_extent()
    bounds = (bb.x0 * to_pt, bb.y0 * to_pt, bb.x1 * to_pt, bb.y1 * to_pt)
    # a line is a row of small obstacles, one every 2 points along it
    along: list[tuple[float, float]] = []
    for xs, ys in lines:
        pts = [
            tuple(p * to_pt for p in ax.transData.transform(q)) for q in zip(xs, ys, strict=True)
        ]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
            n = max(1, int(math.hypot(x1 - x0, y1 - y0) / 2))
            along += [(x0 + (x1 - x0) * i / n, y0 + (y1 - y0) * i / n) for i in range(n + 1)]
    others = [tuple(p * to_pt for p in ax.transData.transform(q)) for q in avoid]
    boxes = place_labels(
        anchors, sizes, radius=radius, bounds=bounds, markers=[*page, *others], lines=along
    )
    for g, (x, y), word, box in zip(groups, anchors, words, boxes, strict=True):
        far = math.hypot((box[0] + box[2]) / 2 - x, (box[1] + box[3]) / 2 - y) > 14 + len(word)
        ann = ax.annotate(
            word,
            xy=xy[g[0]],  # data coordinates: the label stays with its point
            xytext=(box[0] - x + 1, box[1] - y + 0.15 * fontsize),
            textcoords="offset points",
            fontsize=fontsize,
            ha="left",
            va="bottom",
            arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.4"} if far else None,
            annotation_clip=False,
        )
        ann.set_in_layout(False)


# ----- colours: one family per method --------------------------------------------------------


def family_colors(labels: Sequence[str]) -> dict[str, tuple[float, float, float]]:
    """A colour per label. Labels that share a method (the first word: `cpdp sync_period=2`,
    `cpdp sync_period=4`) are shades of one hue, light to dark in the order given, so a family
    reads as one and its order (e.g. K rising) as darkness."""
    from matplotlib import colormaps

    # tab10 is a ListedColormap: colour i is its i-th entry (Colormap, as typed, has no .colors)
    tab10 = colormaps["tab10"]
    hues = [tab10(i)[:3] for i in range(tab10.N)]
    families: dict[str, list[str]] = {}
    for label in labels:
        families.setdefault(label.split(" ", 1)[0], []).append(label)
    out = {}
    for i, members in enumerate(families.values()):
        hue = hues[i % len(hues)]
        n = len(members)
        for j, label in enumerate(members):
            s = 0.0 if n == 1 else -0.55 + 1.0 * j / (n - 1)  # lighter (<0) .. darker (>0)
            out[label] = _shade(hue, s)
    return out


def _shade(hue: tuple[float, float, float], s: float) -> tuple[float, float, float]:
    """`hue` towards white by -s (s < 0) or towards black by s."""
    r, g, b = hue
    if s < 0:
        return r + (1 - r) * -s, g + (1 - g) * -s, b + (1 - b) * -s
    return r * (1 - s), g * (1 - s), b * (1 - s)


def family_markers(labels: Sequence[str]) -> dict[str, str]:
    """A marker per label, distinct within a family (where the shades are close)."""
    seen: dict[str, int] = {}
    out = {}
    for label in labels:
        fam = label.split(" ", 1)[0]
        out[label] = MARKERS[seen.get(fam, 0) % len(MARKERS)]
        seen[fam] = seen.get(fam, 0) + 1
    return out


def short_lr(lr: float) -> str:
    return f"{lr:.3g}"


def without_lr(label: str) -> str:
    return re.sub(r"\s+lr=\S+", "", label).strip()


# ----- k_lr.png: one run's K and LR per optimizer step ---------------------------------------


def lr_per_step(
    boundaries: Sequence[tuple[int, int, int, float, int]], first: int, lrs: Sequence[float]
) -> tuple[list[int], list[float]]:
    """(step, LR) for every optimizer step whose LR is known: `lrs[i]` is the LR of step
    `first + i` (recorded as the run went), and a boundary's record gives its own step's LR,
    which fills the steps before a resume (and step 0, which no record follows)."""
    known = {step: lr for step, lr in enumerate(lrs, first) if not math.isnan(lr)}
    for _start, end, _k, lr, _epoch in boundaries:
        known.setdefault(end, lr)
    steps = sorted(known)
    return steps, [known[s] for s in steps]


def epoch_starts(boundaries: Sequence[tuple[int, int, int, float, int]]) -> dict[int, int]:
    """epoch -> its first optimizer step (every epoch ends with a boundary, so an epoch starts
    after the last boundary of the one before), plus one key past the last epoch: its end."""
    ends: dict[int, int] = {}
    firsts: dict[int, int] = {}
    for start, end, _k, _lr, epoch in boundaries:
        ends[epoch] = max(ends.get(epoch, end), end)
        firsts[epoch] = min(firsts.get(epoch, start), start)
    starts = dict(firsts)
    for epoch, end in ends.items():
        starts[epoch + 1] = end + 1
    return dict(sorted(starts.items()))


def link_changes(schedule: Any, starts: dict[int, int]) -> list[tuple[int, str]]:
    """(optimizer step, profile) where a `--link-schedule` changes the link (docs/design.md §5):
    `@step=N` is step N; `@epoch=N` is epoch N's first step (`starts`, from epoch_starts). None,
    or text that no longer parses, has no changes to mark."""
    from autok.trainer.engine.link import parse_schedule

    if not isinstance(schedule, str):
        return []
    try:
        plan = parse_schedule(schedule)
    except ValueError:
        return []
    marks = []
    for start, profile in plan.segments[1:]:
        step = start if plan.unit == "step" else starts.get(start)
        if step is not None:
            marks.append((step, profile.name))
    return marks


def plot_k_and_lr(
    out: Path,
    boundaries: Sequence[tuple[int, int, int, float, int]],
    summary: dict[str, Any],
    lr_first: int = 0,
    lrs: Sequence[float] = (),
) -> Path:
    """k_lr.png. The question: which K was in force at every optimizer step, and how did it
    follow the LR schedule through the warmup (K held at 1) and the epochs? K (top, log2, whole
    numbers) held over each interval; the LR (bottom) at every step; epoch starts as dotted
    lines numbered on top; the warmup epochs shaded. `boundaries`: (first step, boundary step,
    K, LR, epoch) per boundary; `lrs`: the LR of each step from `lr_first` on (nan: unknown).
    Warmup lengths come from the run's config.json beside `out`, when it is there."""
    plt = pyplot()
    config = {}
    if (out.parent / "config.json").is_file():
        try:
            config = json.loads((out.parent / "config.json").read_text(encoding="utf-8"))
        except ValueError:
            config = {}
    bs = sorted(boundaries, key=lambda b: b[1])
    edges = [bs[0][0]] + [b[1] + 1 for b in bs]
    ks = [b[2] for b in bs]
    steps, lr_values = lr_per_step(bs, lr_first, lrs)
    starts = epoch_starts(bs)
    fig, (ax_k, ax_lr) = plt.subplots(
        2, 1, figsize=(9, 5), sharex=True, height_ratios=(1.1, 1), layout="constrained"
    )
    ax_k.stairs(ks, edges, color="tab:blue", lw=1.6, baseline=None, label="K in force")
    # the cap an adaptive policy cannot pass: a K path flat at the top is the cap, not a choice
    # (a fixed K never meets it, and drawing it there would only squash the path)
    given = config.get("max_sync_period")
    cap = given if type(given) is int and config.get("policy", "fixed") != "fixed" else None
    k_axis(ax_k, ks if cap is None else [*ks, cap])
    if cap is not None:
        cap_label = f"K cap (--max-sync-period {cap})"
        ax_k.axhline(cap, color="tab:red", lw=0.9, ls="--", label=cap_label)
    if len(bs) <= 2000:  # where the syncs were: a rug along the bottom
        low = k_ticks(ks)[0] / 1.18
        ax_k.plot([b[1] for b in bs], [low] * len(bs), "|", color="0.3", ms=5, label="boundary")
    ax_k.set_ylabel("K (sync period)")
    ax_lr.plot(steps, lr_values, color="tab:orange", lw=1.3, label="LR (every step)")
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("optimizer step")
    ax_lr.set_ylim(bottom=0)
    ax_lr.set_xlim(edges[0], edges[-1])

    def shade(epochs: Any, color: str, label: str, axes) -> None:
        if type(epochs) is int and epochs > 0 and epochs in starts:
            for ax in axes:
                ax.axvspan(edges[0], starts[epochs], color=color, lw=0, label=label, zorder=0)

    warm, lr_warm = config.get("warmup_epochs"), config.get("lr_warmup_epochs")
    shade(warm, "0.88", f"warmup: K = 1 ({warm} epoch{'s' * (warm != 1)})", (ax_k, ax_lr))
    if lr_warm != warm:
        shade(lr_warm, "#fde7c8", "LR warmup", (ax_lr,))
    inner = [s for e, s in starts.items() if edges[0] < s < edges[-1]]
    for ax in (ax_k, ax_lr):
        for s in inner:
            ax.axvline(s, color="0.55", lw=0.6, ls=":", zorder=1)
    for step, name in link_changes(config.get("link_schedule"), starts):
        if edges[0] < step < edges[-1]:
            for ax in (ax_k, ax_lr):
                ax.axvline(step, color="tab:purple", lw=1.0, ls="-.", zorder=2,
                           label="link change")  # fmt: skip
            ax_k.text(step, 1.0, f" {name}", transform=ax_k.get_xaxis_transform(),
                      color="tab:purple", fontsize=8, va="top", ha="left")  # fmt: skip
    # epoch numbers on top, at each epoch's middle (thinned to at most 15 labels), counted
    # from 0 as epochs.csv, --link-schedule and the console's epoch lines count them
    spans = sorted(starts.items())
    mids = [((a + b) / 2, e) for (e, a), (_, b) in zip(spans, spans[1:], strict=False)]
    every = max(1, math.ceil(len(mids) / 15))
    top = ax_k.secondary_xaxis("top")
    top.set_xticks([m for m, _ in mids[::every]], [str(e) for _, e in mids[::every]])
    top.set_xlabel("epoch (dotted lines: epoch starts)")
    top.tick_params(length=0)
    handles, labels = [], []
    for ax in (ax_k, ax_lr):
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels))
    link = summary.get("link", "?")
    fig.suptitle(
        f"{summary.get('strategy', '?')} / {summary.get('policy', '?')} on {link}, "
        f"{summary.get('world_size', '?')} workers: K and LR at every optimizer step"
    )
    return save(fig, out)
