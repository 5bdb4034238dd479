"""A 2-D transpose for the FP8 backward: W^T for dgrad, X^T / dY^T of per-tensor and MOSS operands.

Why not `x.t().contiguous()`: on an H100 torch's copy of a transposed uint8 matrix ran far under
HBM bandwidth: in a profile of the 1.5B FP8 step the W^T copies (one per projection and
micro-batch) took a twentieth of it, and copies over a third of the per-tensor recipe's step, whose
activations are transposed the same way. Here a program reads a [BR, BC] tile along
its rows, transposes it in registers/shared memory (tl.trans), and writes rows of the result; the
elements move as integers of their width, so FP8, BF16 and FP32 are all the same kernel.
The reference is quantize.transposed_reference (torch's `x.t().contiguous()`): tests hold the two
to the same bytes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...kernel_launch import Launch, grid1d
from .autotune import ENTRIES, best
from .triton_fp8 import check_device

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
# (BR, BC, num_warps); the first is used where nothing is timed (interpreter, INFIR_FP8_AUTOTUNE=0).
CONFIGS = [(64, 64, 4), (128, 128, 8), (128, 64, 4), (64, 128, 4), (32, 128, 4), (128, 32, 4)]


@triton.jit
def _transpose_kernel(x_ptr, y_ptr, R, C, stride_r, BR: tl.constexpr, BC: tl.constexpr):
    pid = tl.program_id(0)
    n_c = tl.cdiv(C, BC)
    rr = (pid // n_c) * BR + tl.arange(0, BR)
    rc = (pid % n_c) * BC + tl.arange(0, BC)
    x = tl.load(x_ptr + rr[:, None].to(tl.int64) * stride_r + rc[None, :], mask=(rr[:, None] < R) & (rc[None, :] < C))
    # The store's bounds mask is built in the stored [BC, BR] orientation, not by transposing the
    # load's mask (see triton_fp8.mask_t: a transposed boolean tile went wrong on an H100).
    tl.store(y_ptr + rc[:, None].to(tl.int64) * R + rr[None, :], tl.trans(x), mask=(rc[:, None] < C) & (rr[None, :] < R))


def runner(x: torch.Tensor, cfg):
    """run(t) -> t^T for inputs shaped as x, in one configuration (BR, BC, num_warps) of CONFIGS."""
    br, bc, warps = cfg
    R, C = x.shape
    launch = Launch(_transpose_kernel, grid1d(triton.cdiv(R, br) * triton.cdiv(C, bc)), warps)
    as_int, dev, idx, stride = _INT_OF_SIZE[x.element_size()], x.device, x.device.index, x.stride(0)

    def run(t):
        y = torch.empty((C, R), dtype=t.dtype, device=dev)
        launch(idx, t.view(as_int), y.view(as_int), R, C, stride, br, bc)
        return y
    return run


def transpose_2d(x: torch.Tensor) -> torch.Tensor:
    """x [R, C] (unit stride along C) -> a new contiguous [C, R] tensor of the same values,
    equal to x.t().contiguous() byte for byte."""
    if x.dim() != 2 or x.element_size() not in _INT_OF_SIZE:
        raise ValueError(f"transpose_2d takes a 2-D tensor of 1-, 2- or 4-byte elements, got shape "
                         f"{tuple(x.shape)} of {x.dtype}")
    if x.numel() == 0:
        return x.t().contiguous()
    key = ("transpose", x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15 == 0)
    run = ENTRIES.get(key)
    if run is None:
        check_device(x)
        run = ENTRIES[key] = best(lambda c: runner(x, c), CONFIGS, x)
    return run(x)
