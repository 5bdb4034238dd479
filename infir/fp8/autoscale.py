"""MOSS automatic weight scaling (seed 002, §3.2, Eq. 8-10).

AdamW moves each weight by at most ~lr per step (Eq. 8-9), so max|W_t| <= max|W_0| + sum of the
learning rates used since W_0 was measured, and the per-tensor scale can be *predicted* (Eq. 10):
    s_t = (amax_0 + sum_{steps} lr) / fmax
with no max-reduction over the weight. Every `resync_interval` steps (MOSS uses 500) the true
amax is measured again and the sum restarts. The quantize pass still sees the true amax for free
(fused in the kernel), so every step where it exceeded the prediction is counted: with a correct
bound the count stays 0, and it is logged at each re-sync when it is not.

State lives on the weight's device as 0-dim tensors: no host sync per step.
"""
from __future__ import annotations

import logging

import torch

from .formats import amax_with_nan_as_inf, get_format

log = logging.getLogger(__name__)


class AutoScaler:
    def __init__(self, fmt: str = "e4m3", resync_interval: int = 500, name: str = ""):
        if resync_interval < 1:
            raise ValueError(f"resync_interval must be >= 1, got {resync_interval}")
        self.fmax = get_format(fmt).max
        self.resync_interval = resync_interval
        self.name = name
        self.amax_base: torch.Tensor | None = None
        self.lr_sum = 0.0
        self.steps_since_sync = 0
        self.resyncs = 0
        self.exceeded: torch.Tensor | None = None  # steps whose true amax beat the prediction
        self._logged_exceeded = 0

    def needs_resync(self) -> bool:
        return self.amax_base is None or self.steps_since_sync >= self.resync_interval

    def resync(self, weight: torch.Tensor) -> None:
        self.amax_base = amax_with_nan_as_inf(weight.detach())
        self.lr_sum = 0.0
        self.steps_since_sync = 0
        self.resyncs += 1
        if self.exceeded is None:
            self.exceeded = torch.zeros((), dtype=torch.int64, device=weight.device)
        elif self.resyncs > 1:
            n = int(self.exceeded)  # one host sync per interval
            if n > self._logged_exceeded:
                log.warning("autoscale %s: true weight amax exceeded the predicted bound on %d step(s) so far",
                            self.name or "<weight>", n)
                self._logged_exceeded = n

    def predicted_amax(self) -> torch.Tensor:
        return self.amax_base + self.lr_sum

    def scale(self, weight: torch.Tensor) -> torch.Tensor:
        """Eq. 10: the FP32 per-tensor dequantization scale for this step's weight."""
        if self.needs_resync():
            self.resync(weight)
        pred = self.predicted_amax()
        return torch.where(pred > 0, pred / self.fmax, torch.ones_like(pred)).float()

    def observe(self, true_amax: torch.Tensor) -> None:
        """Count a misprediction (true amax above the bound); a device op, no sync."""
        self.exceeded += (true_amax > self.predicted_amax()).to(torch.int64)

    def step(self, lr: float) -> None:
        """Call once per optimizer step with the learning rate that step used."""
        self.lr_sum += float(lr)
        self.steps_since_sync += 1

    def state_dict(self) -> dict:
        return {"amax_base": self.amax_base, "lr_sum": self.lr_sum, "steps_since_sync": self.steps_since_sync,
                "resyncs": self.resyncs, "exceeded": self.exceeded}

    def load_state_dict(self, state: dict) -> None:
        self.amax_base = state["amax_base"]
        self.lr_sum = state["lr_sum"]
        self.steps_since_sync = state["steps_since_sync"]
        self.resyncs = state["resyncs"]
        self.exceeded = state["exceeded"]
