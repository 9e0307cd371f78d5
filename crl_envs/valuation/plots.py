"""The valuation's figure: individual strength against each compositional measure, labels placed so
that none overlaps another or a marker (matplotlib, imported only when a figure is drawn).

:meth:`ValuationReport.figure <crl_envs.valuation.report.ValuationReport.figure>` and
:meth:`~crl_envs.valuation.report.ValuationReport.plot` call these with the report and its measures'
labels; the report's data, table and JSON stay in :mod:`crl_envs.valuation.report`, which this module
does not import (the report imports it when a figure is asked for).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def figure(report: Any, labels: Mapping[str, str]) -> Any:
    """The figure :func:`plot` saves: individual strength (x) vs each compositional measure (y), one
    panel per measure, a point per model with its CIs as error bars, labelled by model name.
    The title wraps to the figure's width, the legend sits below the panels, and each label takes
    the first free spot around its point, so nothing is cropped and no two labels overlap. ``report`` is
    a :class:`~crl_envs.valuation.report.ValuationReport`; ``labels`` names its measures (``"loo" -> "LOO"``)."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    comps = {k: m for k, m in report.measures.items() if k != "individual"}
    width = max(6.4, 5.4 * len(comps))
    fig, axes = plt.subplots(1, len(comps), figsize=(width, 5.6), squeeze=False, layout="constrained")
    x, xci = report.individual.means, report.individual.ci
    colors = plt.get_cmap("tab10")
    handles = []
    for ax, (k, m) in zip(axes[0], comps.items()):
        handles = []
        for i, a in enumerate(report.ids):
            xerr = [[x[i] - xci[a][0]], [xci[a][1] - x[i]]]
            yerr = [[m[a] - m.ci[a][0]], [m.ci[a][1] - m[a]]]
            handles.append(ax.errorbar(x[i], m[a], xerr=xerr, yerr=yerr, fmt="o", ms=8, capsize=4,
                                       color=colors(i % 10), label=report.names[i], zorder=3))
        ax.axhline(0, color="0.7", lw=0.8, zorder=0)
        kt = report.correlation[k]["kendall"]
        ax.set_title(f"{labels[k]}: Kendall tau-b {_two(kt.value)}, exact p = {_two(kt.p_value)}",
                     fontsize=11)
        ax.set_xlabel("individual strength (accuracy alone)", fontsize=11)
        ax.set_ylabel(f"compositional strength ({labels[k]})", fontsize=11)
        ax.grid(alpha=0.3)
        ax.margins(0.18)
    fig.legend(handles=handles, labels=report.names, loc="outside lower center", fontsize=10, frameon=False,
               ncol=max(1, min(len(report.ids), int(width / 1.9))))  # ~1.9 in per entry: rows, not overflow
    title = (f"{report.protocol} on {report.task} — {report.n_questions} questions, v(N) = {report.system.mean():.3f}, "
             f"{round(report.ci_level * 100)}% CIs")
    fig.suptitle("\n".join(textwrap.wrap(title, width=int(width * 9))), fontsize=12)
    fig.canvas.draw()  # settle the layout, then place labels in the final geometry
    fig.set_layout_engine("none")
    for ax, m in zip(axes[0], comps.values()):
        _place_labels(ax, [(x[i], m[a]) for i, a in enumerate(report.ids)], report.names,
                      [colors(i % 10) for i in range(len(report.ids))])
    return fig



def plot(report: Any, labels: Mapping[str, str], path: str | os.PathLike) -> Path:
    """Save :func:`figure` as a PNG (or any format matplotlib infers from ``path``)."""
    return save_figure(figure(report, labels), path, dpi=120, bbox_inches="tight", pad_inches=0.15)


def save_figure(fig: Any, path: str | os.PathLike, **savefig: Any) -> Path:
    """Write ``fig`` to ``path`` (its folder made first) and close it: the valuation figures' one saver."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, **savefig)
    plt.close(fig)
    return path


#: Offsets (points) tried for a label around its point, nearest first.
_LABEL_OFFSETS = [(dx * r, dy * r) for r in (1, 2, 3, 4, 5) for dx, dy in
                  ((1, 1), (1, -1), (-1, 1), (-1, -1), (0, 1.4), (0, -1.4), (1.4, 0), (-1.4, 0))]


def _place_labels(ax: Any, points: Sequence[tuple[float, float]], names: Sequence[str], colors: Sequence[Any]) -> None:
    """Annotate each point with its name at the first offset where the label overlaps no other label
    and no marker and stays inside the axes (greedy, in display coordinates; the least-overlapping
    offset when none is free)."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    markers = [ax.transData.transform(p) for p in points]
    radius = 6 * fig.dpi / 72  # a marker of ms=8 has a radius of 4 points; keep 2 more clear
    placed: list[Any] = []
    for (px, py), name, color in zip(points, names, colors):
        best, best_cost = None, None
        for dx, dy in _LABEL_OFFSETS:
            text = ax.annotate(name, (px, py), textcoords="offset points", xytext=(8 * dx, 8 * dy),
                               ha="left" if dx > 0 else "right" if dx < 0 else "center",
                               va="bottom" if dy > 0 else "top" if dy < 0 else "center", fontsize=10,
                               color=color, zorder=4,
                               bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.7})
            box = text.get_window_extent(renderer).expanded(1.04, 1.1)
            cost = sum(_overlap(box, other) for other in placed)
            cost += sum(_overlap(box, _marker_box(mx, my, radius)) for mx, my in markers)
            outside = box.width * box.height - _overlap(box, frame)
            cost += 10 * outside
            if best_cost is None or cost < best_cost:
                if best is not None:
                    best[0].remove()
                best, best_cost = (text, box), cost
            else:
                text.remove()
            if cost == 0:
                break
        placed.append(best[1])


def _marker_box(x: float, y: float, r: float) -> Any:
    from matplotlib.transforms import Bbox

    return Bbox([[x - r, y - r], [x + r, y + r]])


def _overlap(a: Any, b: Any) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def _two(v: float | None) -> str:
    """Two decimals for a title; ``n/a`` for a correlation that is undefined (NaN)."""
    return "n/a" if v is None or math.isnan(v) else f"{v:.2f}"
