"""The report's figures (matplotlib, headless). Each function returns a Figure, or None when no run logged
the quantity (a CPU run has no MFU), so the report shows only plots that mean something.

Colours follow the precision, the same in every figure: the baseline is always blue (C0).
"""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from infir.report.pairing import Pair, column, groups, smooth, relative_gap, run_stats  # noqa: E402
from infir.report.runs import EvalResult, Run  # noqa: E402


def precision_colours(precisions, baseline: str) -> dict[str, str]:
    others = sorted(p for p in set(precisions) if p != baseline)
    return {baseline: "C0", **{p: f"C{i + 1}" for i, p in enumerate(others)}}


def _legend_above(ax) -> None:
    # above the axes, not inside: bars and their value labels fill the inside
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, frameon=False)


def _grid(n: int, width: float = 6.0, height: float = 4.0):
    cols = min(n, 2)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def curve_figure(runs: list[Run], key: str, baseline: str, smoothed: bool) -> plt.Figure | None:
    """`key` (loss or val_loss) vs consumed tokens, one panel per (model, stage)."""
    rows_of = (lambda r: r.train) if key == "loss" else (lambda r: r.val)
    by_group = {g: [r for r in members if rows_of(r)] for g, members in groups(runs).items()}
    by_group = {g: m for g, m in by_group.items() if m}
    if not by_group:
        return None
    colours = precision_colours([r.precision for r in runs], baseline)
    fig, axes = _grid(len(by_group))
    for ax, ((model, stage), members) in zip(axes, by_group.items()):
        for run in members:
            x, y = column(rows_of(run), "consumed_tokens"), column(rows_of(run), key)
            c = colours[run.precision]
            if smoothed:
                ax.plot(x, y, color=c, alpha=0.25, linewidth=0.8)
                ax.plot(x, smooth(y), color=c, linewidth=2, label=run.precision)
            else:
                ax.plot(x, y, color=c, marker="o", linewidth=2, label=run.precision)
        ax.set(title=f"{model} {stage}", xlabel="consumed tokens", ylabel=key.replace("_", " "))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def gap_figure(pairs: list[Pair], baseline: str) -> plt.Figure | None:
    """Relative loss gap (other - baseline) / baseline in percent vs tokens: smoothed train loss and val loss."""
    if not pairs:
        return None
    colours = precision_colours([p.other.precision for p in pairs] + [baseline], baseline)
    keyed = {}
    for p in pairs:
        keyed.setdefault((p.other.model, p.other.stage), []).append(p)
    fig, axes = _grid(len(keyed))
    for ax, ((model, stage), members) in zip(axes, keyed.items()):
        ax.axhline(0.0, color=colours[baseline], linewidth=1, label=f"{baseline} (reference)")
        for p in members:
            c = colours[p.other.precision]
            bx, by = column(p.base.train, "consumed_tokens"), smooth(column(p.base.train, "loss"))
            ox, oy = column(p.other.train, "consumed_tokens"), smooth(column(p.other.train, "loss"))
            x, gap = relative_gap(bx, by, ox, oy)
            ax.plot(x, 100 * gap, color=c, linewidth=2, label=f"{p.other.precision} train (smoothed)")
            if p.base.val and p.other.val:
                vx, vgap = relative_gap(
                    column(p.base.val, "consumed_tokens"), column(p.base.val, "val_loss"),
                    column(p.other.val, "consumed_tokens"), column(p.other.val, "val_loss"),
                )
                ax.plot(vx, 100 * vgap, color=c, marker="s", linestyle="--", label=f"{p.other.precision} val")
        ax.set(title=f"{model} {stage}: loss gap vs {baseline}", xlabel="consumed tokens", ylabel="relative gap (%)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def bar_figure(runs: list[Run], stat: str, ylabel: str, baseline: str) -> plt.Figure | None:
    """One RunStats field per run as grouped bars: groups are (model, stage), bars are precisions."""
    values = {(r.model, r.stage, r.precision): getattr(run_stats(r), stat) for r in runs}
    if all(math.isnan(v) for v in values.values()):
        return None
    colours = precision_colours([r.precision for r in runs], baseline)
    group_keys = list(groups(runs))
    precisions = list(colours)
    width = 0.8 / len(precisions)
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * len(group_keys)), 4.0))
    for i, prec in enumerate(precisions):
        heights = [values.get((m, s, prec), math.nan) for m, s in group_keys]
        xs = np.arange(len(group_keys)) + (i - (len(precisions) - 1) / 2) * width
        bars = ax.bar(xs, np.nan_to_num(heights), width, color=colours[prec], label=prec)
        ax.bar_label(bars, labels=["" if math.isnan(h) else f"{h:.4g}" for h in heights], fontsize=8)
    ax.set_xticks(np.arange(len(group_keys)), [f"{m}\n{s}" for m, s in group_keys])
    ax.set(ylabel=ylabel)
    ax.grid(axis="y", alpha=0.3)
    _legend_above(ax)
    fig.tight_layout()
    return fig


def eval_figure(evals: list[EvalResult], baseline: str) -> plt.Figure | None:
    """Eval scores as grouped bars: groups are `benchmark metric`, bars are model-precision variants."""
    if not evals:
        return None
    metrics = sorted({k for e in evals for k in e.scores})
    colours = precision_colours([e.precision for e in evals], baseline)
    width = 0.8 / len(evals)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(metrics)), 4.0))
    for i, e in enumerate(sorted(evals, key=lambda e: (e.model, e.precision != baseline, e.precision))):
        heights = [e.scores.get(m, math.nan) for m in metrics]
        xs = np.arange(len(metrics)) + (i - (len(evals) - 1) / 2) * width
        bars = ax.bar(xs, np.nan_to_num(heights), width, color=colours[e.precision], label=e.variant)
        ax.bar_label(bars, labels=["" if math.isnan(h) else f"{h:.3f}" for h in heights], fontsize=8)
    ax.set_xticks(np.arange(len(metrics)), [m.replace(" ", "\n", 1) for m in metrics])
    ax.set(ylabel="score")
    ax.grid(axis="y", alpha=0.3)
    _legend_above(ax)
    fig.tight_layout()
    return fig


def all_figures(runs: list[Run], pairs: list[Pair], evals: list[EvalResult], baseline: str):
    """(slug, title, figure) for every plot that has data, in report order."""
    candidates = [
        ("loss", "Training loss vs tokens (centred moving mean; raw curve faint)",
         curve_figure(runs, "loss", baseline, smoothed=True)),
        ("val_loss", "Validation loss vs tokens", curve_figure(runs, "val_loss", baseline, smoothed=False)),
        ("loss_gap", f"Relative loss gap vs {baseline}", gap_figure(pairs, baseline)),
        ("tokens_per_s", "Throughput (median tokens/s after warm-up)", bar_figure(runs, "tokens_per_s", "tokens/s", baseline)),
        ("mfu", "Model FLOPs utilisation (median after warm-up)", bar_figure(runs, "mfu", "MFU", baseline)),
        ("peak_mem", "Peak GPU memory", bar_figure(runs, "peak_mem_gib", "GiB", baseline)),
        ("eval", "Evaluation scores", eval_figure(evals, baseline)),
    ]
    return [(slug, title, fig) for slug, title, fig in candidates if fig is not None]
