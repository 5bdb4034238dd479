"""Who is compared with whom, and the numbers of a comparison (pure functions on Run rows).

Runs of the same model and stage form a group; inside it every precision is compared with the
baseline precision (bf16 by default). Curves are aligned on consumed tokens, not steps, so runs with
different batch sizes or a resumed run with a gap still line up.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from infir.report.runs import Run

WARMUP_FRACTION = 0.1  # first steps of a run carry compile/allocator warm-up: left out of throughput medians


def column(rows: list[dict], key: str) -> np.ndarray:
    return np.array([float(r[key]) if r.get(key) is not None else math.nan for r in rows], dtype=float)


def smooth(values: np.ndarray, window: int | None = None) -> np.ndarray:
    """Centred moving mean over ±`window` points (default ~3 % of the run, none below 30 points), NaNs skipped:
    no lag, unlike an EMA."""
    values = np.asarray(values, dtype=float)
    window = len(values) // 30 if window is None else window
    if window == 0:
        return values.copy()
    valid = ~np.isnan(values)
    sums = np.concatenate([[0.0], np.cumsum(np.where(valid, values, 0.0))])
    counts = np.concatenate([[0], np.cumsum(valid)])
    idx = np.arange(len(values))
    lo, hi = np.clip(idx - window, 0, len(values)), np.clip(idx + window + 1, 0, len(values))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (sums[hi] - sums[lo]) / (counts[hi] - counts[lo])


def relative_gap(base_x, base_y, other_x, other_y) -> tuple[np.ndarray, np.ndarray]:
    """(other - base) / base on base's x grid where both curves are defined (other is interpolated)."""
    base_x, base_y = np.asarray(base_x, float), np.asarray(base_y, float)
    other_x, other_y = np.asarray(other_x, float), np.asarray(other_y, float)
    ok = ~np.isnan(other_y) & ~np.isnan(other_x)
    other_x, other_y = other_x[ok], other_y[ok]
    if other_x.size == 0:
        return np.array([]), np.array([])
    order = np.argsort(other_x)
    other_x, other_y = other_x[order], other_y[order]
    inside = (base_x >= other_x[0]) & (base_x <= other_x[-1]) & ~np.isnan(base_y)
    x = base_x[inside]
    return x, (np.interp(x, other_x, other_y) - base_y[inside]) / base_y[inside]


def steady(values: np.ndarray) -> np.ndarray:
    values = values[~np.isnan(values)]
    skip = int(len(values) * WARMUP_FRACTION)
    return values[skip:] if len(values) - skip > 0 else values


@dataclass
class RunStats:
    final_loss: float
    final_val_loss: float
    tokens_per_s: float
    mfu: float
    peak_mem_gib: float
    consumed_tokens: float


def _median(values: np.ndarray) -> float:
    values = steady(values)
    return float(np.median(values)) if values.size else math.nan


def run_stats(run: Run) -> RunStats:
    loss = column(run.train, "loss")
    tail = loss[~np.isnan(loss)][-max(1, len(loss) // 20):]  # mean of the last 5%: one noisy step is not "final"
    val = column(run.val, "val_loss")
    mem = column(run.train, "peak_mem_gib")
    tokens = column(run.train + run.val, "consumed_tokens")
    return RunStats(
        final_loss=float(tail.mean()) if tail.size else math.nan,
        final_val_loss=float(val[~np.isnan(val)][-1]) if np.any(~np.isnan(val)) else math.nan,
        tokens_per_s=_median(column(run.train, "tokens_per_s")),
        mfu=_median(column(run.train, "mfu")),
        peak_mem_gib=float(np.nanmax(mem)) if np.any(~np.isnan(mem)) else math.nan,
        consumed_tokens=float(np.nanmax(tokens)) if np.any(~np.isnan(tokens)) else math.nan,
    )


def _ratio(a: float, b: float) -> float:
    """a / b, NaN where either is missing or b is zero (a CPU run logs no MFU)."""
    return a / b if b and not (math.isnan(a) or math.isnan(b)) else math.nan


@dataclass
class Pair:
    """One run compared with the baseline run of its (model, stage) group."""

    base: Run
    other: Run

    @property
    def label(self) -> str:
        return f"{self.other.model} {self.other.stage}: {self.other.precision} vs {self.base.precision}"

    def summary(self) -> dict[str, float]:
        b, o = run_stats(self.base), run_stats(self.other)
        return {
            "final loss gap %": 100 * (_ratio(o.final_loss, b.final_loss) - 1),
            "final val loss gap %": 100 * (_ratio(o.final_val_loss, b.final_val_loss) - 1),
            "tokens/s ratio": _ratio(o.tokens_per_s, b.tokens_per_s),
            "MFU ratio": _ratio(o.mfu, b.mfu),
            "peak memory ratio": _ratio(o.peak_mem_gib, b.peak_mem_gib),
        }


def groups(runs: list[Run]) -> dict[tuple[str, str], list[Run]]:
    """Runs keyed by (model, stage), each list sorted by precision so colours are stable across plots."""
    out = defaultdict(list)
    for run in runs:
        out[(run.model, run.stage)].append(run)
    return {k: sorted(v, key=lambda r: (r.precision, r.name)) for k, v in sorted(out.items())}


def pairs(runs: list[Run], baseline: str = "bf16") -> list[Pair]:
    """Every non-baseline run paired with the baseline-precision run of the same model and stage."""
    out = []
    for (model, stage), members in groups(runs).items():
        bases = [r for r in members if r.precision == baseline]
        if len(bases) > 1:
            raise ValueError(
                f"{len(bases)} {baseline} runs for {model} {stage} ({', '.join(str(r.source) for r in bases)}): "
                "pass one run dir per precision"
            )
        out += [Pair(bases[0], r) for r in members if bases and r.precision != baseline]
    return out
