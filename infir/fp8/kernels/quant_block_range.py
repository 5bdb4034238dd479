"""Triton twins of block_range.py: a weight's element range (a ZeRO-1 shard) quantized per 128x128 block
with scales of the whole weight. One program per block of the touched 128-row bands; its tile is masked
to the range, so the loads and stores touch only the range's elements.

Reference: block_range.block_range_amax_reference / quantize_block_range_reference, bit for bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernel_launch import Launch, grid1d
from ..block_range import row_bands
from ..policy import kernel_policy
from ..quantize import WEIGHT_BLOCK
from .autotune import ENTRIES
from .triton_fp8 import abs_nan_inf, check_device, consts, inv_scale, q8, quot_safe

_WARPS = 8  # a 128x128 FP32 tile per program, as the whole-weight block kernel


@triton.jit
def _range_tile(flat_ptr, start, end, band0, pid, N, K):
    """The offsets (in the range), mask and values of block `pid` of the bands from band0."""
    n_kb = tl.cdiv(K, 128)
    rm = (band0 + pid // n_kb) * 128 + tl.arange(0, 128)
    rk = (pid % n_kb) * 128 + tl.arange(0, 128)
    idx = rm[:, None].to(tl.int64) * K + rk[None, :]
    mask = (rm[:, None] < N) & (rk[None, :] < K) & (idx >= start) & (idx < end)
    x = tl.load(flat_ptr + (idx - start), mask=mask, other=0.0).to(tl.float32)
    return idx - start, mask, x


@triton.jit
def _range_amax_kernel(flat_ptr, out_ptr, start, end, band0, N, K):
    pid = tl.program_id(0)
    _, _, x = _range_tile(flat_ptr, start, end, band0, pid, N, K)
    tl.store(out_ptr + band0 * tl.cdiv(K, 128) + pid, tl.max(tl.max(abs_nan_inf(x), axis=1), axis=0))


@triton.jit
def _range_quant_kernel(flat_ptr, scale_ptr, q_ptr, start, end, band0, N, K,
                        FMAX: tl.constexpr, UE8M0: tl.constexpr, OUT_DTYPE: tl.constexpr, DIV: tl.constexpr):
    pid = tl.program_id(0)
    off, mask, x = _range_tile(flat_ptr, start, end, band0, pid, N, K)
    s = tl.load(scale_ptr + band0 * tl.cdiv(K, 128) + pid)
    if DIV == 2:
        ok = quot_safe(s) == 1
    else:
        ok = True
    tl.store(q_ptr + off, q8(x, s, inv_scale(s, UE8M0), ok, FMAX, OUT_DTYPE, DIV), mask=mask)


def _launch(kernel, flat: torch.Tensor, start: int, shape, *key) -> tuple[Launch, int]:
    """The kernel's launcher for this range (a ZeRO-1 shard is the same range every step, so each
    weight's launches are set up once), and its first band. Keyed on every value Triton specializes on."""
    check_device(flat)
    full = (kernel, flat.numel(), start, tuple(shape), flat.dtype, flat.device, flat.data_ptr() & 15, *key)
    hit = ENTRIES.get(full)
    if hit is None:
        b0, b1 = row_bands(start, flat.numel(), shape)
        hit = ENTRIES[full] = Launch(kernel, grid1d((b1 - b0) * triton.cdiv(shape[1], WEIGHT_BLOCK)), _WARPS), b0
    return hit


def block_range_amax_triton(flat: torch.Tensor, start: int, shape: tuple[int, int], out: torch.Tensor) -> torch.Tensor:
    launch, b0 = _launch(_range_amax_kernel, flat, start, shape, out.data_ptr() & 15)
    launch(flat.device.index, flat, out, start, start + flat.numel(), b0, *shape)
    return out


def quantize_block_range_triton(flat: torch.Tensor, start: int, shape: tuple[int, int], scale: torch.Tensor,
                                scale_format: str, fmt: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """FP8 of the range (into `out`, a 1-D FP8 tensor of its size, where given)."""
    (fmax, ue, odt, div), dt = consts(fmt, scale_format)
    q = torch.empty(flat.numel(), dtype=dt, device=flat.device) if out is None else out
    launch, b0 = _launch(_range_quant_kernel, flat, start, shape, scale.data_ptr() & 15, q.data_ptr() & 15, scale_format, fmt)
    soft = kernel_policy().interpret
    launch(flat.device.index, flat, scale, q.view(torch.uint8) if soft else q, start, start + flat.numel(), b0, *shape,
           fmax, ue, odt, div)
    return q
