"""The chunked LM loss's per-chunk math in plain PyTorch (infir/model/lm_loss.py runs it on the CPU):
the references of its Triton kernels, kernels/lm_loss.py, beside which they are registered and tested.
Imports no kernel.

One chunk of logits z [n, V/tp] (a vocabulary shard) with targets: its softmax statistics (row max,
sum of exponentials, target logit), then dL/dz = w * (softmax(z) - onehot(target)) written over z.
"""
from __future__ import annotations

import torch


def chunk_stats_torch(logits: torch.Tensor, target: torch.Tensor):
    """Row max m, sum of exp(z - m), and the target logit (0 where the target is not on this shard)."""
    z = logits.float()
    m = z.amax(dim=-1)
    s = torch.exp(z - m[:, None]).sum(dim=-1)
    owned = (target >= 0) & (target < z.shape[1])
    tgt = z.gather(1, target.clamp(0, z.shape[1] - 1)[:, None]).squeeze(1) * owned
    return m, s, tgt


def chunk_grad_torch(logits: torch.Tensor, target: torch.Tensor, m: torch.Tensor, s: torch.Tensor, w: torch.Tensor) -> None:
    """In place: logits <- w * (softmax(logits) - onehot(target)), the softmax from the global m, s."""
    g = torch.exp(logits.float() - m[:, None]).div_(s[:, None])
    owned = (target >= 0) & (target < g.shape[1])
    rows = owned.nonzero().squeeze(1)
    g[rows, target[rows]] -= 1.0
    logits.copy_(g.mul_(w[:, None]))
