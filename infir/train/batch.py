"""Micro-batches: which samples a rank reads at a step, and the tensors the model takes.

Sample order is a pure function of (step, rank), so a resumed run reads exactly the samples the
uninterrupted run would have read: the loss curve continues unchanged.
"""
from __future__ import annotations

import numpy as np
import torch


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


def attention_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """Megatron-convention mask [b, 1, s, s], True = masked out: causal, and no attention across samples.

    The data side's mask (True = may attend, SDPA's convention) inverted. With the block-diagonal mask,
    RoPE needs no position reset: attention inside one sample depends only on relative positions,
    which are the same whether positions restart at the sample or not.
    """
    from infir.data.sft import packed_attention_mask

    return ~packed_attention_mask(segment_ids)[:, None]


def to_model_inputs(batch: dict[str, torch.Tensor], device: torch.device) -> dict:
    tokens = batch["tokens"].to(device, non_blocking=True).long()
    out = {
        "input_ids": tokens,
        "position_ids": batch["position_ids"].to(device, non_blocking=True).long()
        if "position_ids" in batch
        else torch.arange(tokens.shape[1], device=device).expand_as(tokens),
        "labels": batch["labels"].to(device, non_blocking=True).long(),
        "loss_mask": batch["loss_mask"].to(device, non_blocking=True).float()
        if "loss_mask" in batch
        else torch.ones_like(tokens, dtype=torch.float),
        "attention_mask": attention_mask(batch["segment_ids"].to(device)) if "segment_ids" in batch else None,
    }
    return out
