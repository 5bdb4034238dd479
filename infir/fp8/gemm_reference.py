"""The FP8 GEMM in plain PyTorch: both operands dequantized, multiplied in float32, on any device.
gemm.py's "emulated" backend, and the reference of the fast GEMMs (torch's scaled_mm, kernels/
gemm_two_level.py, kernels/lt_wgrad.py). Imports no kernel."""
from __future__ import annotations

import torch

from .quantize import QTensor, dequantize


def emulated_gemm(a: QTensor, b: QTensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """C [M, N] = A [M, K] @ B [N, K]^T from the dequantized operands, in out_dtype."""
    return (dequantize(a) @ dequantize(b).t()).to(out_dtype)
