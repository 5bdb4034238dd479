"""RMSNorm for megatron's layer slots, sequence-parallel aware.

megatron's WrappedTorchNorm refuses sequence parallelism (transformer/torch_norm.py:32) and its
fused norms need apex or Transformer Engine. Under sequence parallelism each TP rank normalises a
slice of the sequence, so the weight's gradient is partial: the `sequence_parallel` mark makes
megatron's finalize_model_grads sum it over the TP group. State-dict key (`weight`) as torch's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class RMSNorm(torch.nn.Module):
    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **_):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = bool(config.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
