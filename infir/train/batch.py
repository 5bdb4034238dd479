"""Micro-batches: which samples a rank reads at a step, and the tensors the model takes.

Sample order is a pure function of (step, rank), so a resumed run reads exactly the samples the
uninterrupted run would have read: the loss curve continues unchanged.
"""
from __future__ import annotations

import numpy as np
import torch

from infir.model.documents import build_layout, cp_positions


def sample_indices(step: int, micro: int, *, global_batch: int, micro_batch: int, dp: int, dp_rank: int, num_samples: int, seed: int, shuffle: bool = True) -> list[int]:
    """Dataset indices of micro-batch `micro` of optimizer step `step` on data-parallel rank `dp_rank`.

    Global sample g = step * global_batch + (dp_rank * per_rank + micro * micro_batch + j); an epoch
    is `num_samples` consecutive global samples, visited in a permutation seeded by (seed, epoch), or
    in order for datasets that are shuffled already and must keep their order (phases of a mixture).
    """
    per_rank = global_batch // dp
    base = step * global_batch + dp_rank * per_rank + micro * micro_batch
    out = []
    for g in range(base, base + micro_batch):
        epoch, pos = divmod(g, num_samples)
        out.append(int(_permutation(num_samples, seed, epoch)[pos]) if shuffle else pos)
    return out


_perm_cache: dict[tuple[int, int, int], np.ndarray] = {}


def _permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    key = (n, seed, epoch)
    if key not in _perm_cache:
        if len(_perm_cache) > 4:
            _perm_cache.clear()
        _perm_cache[key] = np.random.default_rng([seed, epoch]).permutation(n)
    return _perm_cache[key]


def collate(samples: list[dict]) -> dict[str, torch.Tensor]:
    keys = samples[0].keys()
    return {k: torch.stack([torch.as_tensor(s[k]) for s in samples]) for k in keys}


def to_model_inputs(batch: dict[str, torch.Tensor], device: torch.device, cp: int = 1, cp_rank: int = 0) -> dict:
    """The model's inputs on `device`, for the tokens context-parallel rank `cp_rank` of `cp` holds.

    Rows whose positions restart (packed documents) or a context-parallel split come with a
    `DocumentLayout` as `packed_seq_params`, built on the host from the full rows' positions; plain
    causal rows with None. `loss_tokens`: the sum of this rank's loss mask, counted on the host.
    """
    tokens = batch["tokens"]
    positions = batch["position_ids"] if "position_ids" in batch else torch.arange(tokens.shape[1]).expand_as(tokens)
    layout = build_layout(positions, cp, cp_rank)
    local = torch.as_tensor(cp_positions(tokens.shape[1], cp, cp_rank)) if cp > 1 else None
    loss_mask = batch["loss_mask"].float() if "loss_mask" in batch else torch.ones(tokens.shape, dtype=torch.float)

    def put(t, dtype):
        return (t if local is None else t[:, local]).to(device, dtype, non_blocking=True)

    mine = loss_mask if local is None else loss_mask[:, local]
    return {
        "loss_tokens": float(mine.sum()),
        "input_ids": put(tokens, torch.long),
        "position_ids": put(positions, torch.long),
        "labels": put(batch["labels"], torch.long),
        "loss_mask": put(loss_mask, torch.float),
        "packed_seq_params": layout.to(device) if layout is not None else None,
    }
