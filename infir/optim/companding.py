"""Companded 8-bit optimizer states (FlashOptim §3.2, Algorithms 2-3), plain PyTorch.

Each flat tensor is cut into groups of 32; a group is divided by its absolute maximum (kept as
an fp16 scale, 1/16 byte per element), passed through a companding function, and rounded to 8
bits:
- momentum: softsign ``y = 2x / (1 + |x|)`` before int8 (signed, 127 levels): it spends more
  codes near zero, where most momentum values of a group sit below the group's maximum;
- variance: stored as ``sqrt(v)`` in uint8 (255 levels): the square root halves the dynamic
  range, and the update divides by sqrt(v) anyway.

The op order (normalise by the fp32 absmax, store the fp16-rounded absmax) is the one of the
fused kernels, so these functions are their bit-exact twin.
"""
import torch
import torch.nn.functional as F

from infir.optim.adam_math import div, sqrt_rn

GROUP = 32
_TINY = 1e-12  # absmax floor: an all-zero group normalises to zeros instead of NaN


def num_groups(numel: int) -> int:
    return (numel + GROUP - 1) // GROUP


def _grouped(x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1).float()
    pad = (-flat.numel()) % GROUP
    # zero padding cannot raise a group's absmax, so the tail group matches the kernels' masking
    return F.pad(flat, (0, pad)).view(-1, GROUP)


def _ungrouped(groups: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return groups.reshape(-1)[: like.numel()].view(like.shape)


def quantize_momentum(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 momentum -> (int8 codes shaped like m, fp16 per-group scales). Algorithm 2."""
    groups = _grouped(m)
    absmax = groups.abs().amax(dim=1).clamp_min(_TINY)
    x = groups / absmax[:, None]
    y = 2.0 * x / (1.0 + x.abs())
    codes = torch.floor(y * 127.0 + 0.5).to(torch.int8)
    return _ungrouped(codes, m), absmax.to(torch.float16)


def momentum_unit(codes: torch.Tensor) -> torch.Tensor:
    """int8 code -> its value in units of the group scale (inverse softsign of code / 127).
    A function of the code alone: the fused kernel reads it from a 256-entry table."""
    y = div(codes.float(), 127.0)
    return y / (2.0 - y.abs())


def variance_unit(codes: torch.Tensor) -> torch.Tensor:
    """uint8 code -> sqrt(v) in units of the group scale."""
    return div(codes.float(), 255.0)


def dequantize_momentum(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return _ungrouped(momentum_unit(_grouped(codes)) * scales.float()[:, None], codes)


def quantize_variance(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 variance (>= 0) -> (uint8 codes of sqrt(v), fp16 per-group scales). Algorithm 3."""
    groups = sqrt_rn(_grouped(v))
    absmax = groups.amax(dim=1).clamp_min(_TINY)
    codes = torch.floor(groups / absmax[:, None] * 255.0 + 0.5).to(torch.uint8)
    return _ungrouped(codes, v), absmax.to(torch.float16)


def dequantize_variance(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    root = variance_unit(_grouped(codes)) * scales.float()[:, None]
    return _ungrouped(root * root, codes)
