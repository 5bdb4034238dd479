"""Learning-rate schedules as pure functions of the step.

- cosine: linear warmup to `lr`, then cosine decay to `min_lr` at the last step (InfiR2's SFT).
- wsd: linear warmup, constant `lr`, then a linear decay to `min_lr` over the final `decay_iters`
  steps (InfiR2's CPT: warmup 5000, constant, decay over 5000).
"""
from __future__ import annotations

import math


def resolve_warmup(warmup: float | int, total: int) -> int:
    """A warmup given as a fraction (< 1) is a share of all steps (InfiR2 SFT: 5% warmup)."""
    if warmup is None:
        return 0
    if 0 < warmup < 1:
        return int(round(warmup * total))
    return int(warmup)


def lr_at(step: int, *, total: int, lr: float, min_lr: float, warmup: int, schedule: str = "cosine", decay: int | None = None) -> float:
    """LR for optimizer step `step` (0-based) of `total`."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    if schedule == "cosine":
        span = max(total - warmup, 1)
        progress = min(max(step - warmup, 0) / span, 1.0)
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "wsd":
        decay = total - warmup if decay is None else min(decay, total - warmup)
        start = total - decay
        if step < start or decay <= 0:
            return lr
        progress = min((step - start + 1) / decay, 1.0)
        return lr + (min_lr - lr) * progress
    raise ValueError(f"stage.schedule={schedule!r}; valid: cosine, wsd, constant")
