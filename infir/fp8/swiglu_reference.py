"""SwiGLU and its FP8-input variant in plain PyTorch: the references of kernels/swiglu.py (and of the
SwiGLU kernels of quant_both.cu); infir.fp8.swiglu picks between the two. Imports no kernel.

The FP8-input variant keeps h = [gate, up] for the backward as E4M3 with one scale per 1x128 block
(quantize_token_ref): the forward output comes from the exact h, the backward from the dequantized copy.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .formats import get_format
from .quantize import QTensor, dequantize, quantize_reference, quantize_token_ref


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for h = [gate, up] along the last dim (megatron's gated linear unit)."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def swiglu_backward(h: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dL/dh for y = swiglu(h), in float32: [dy * up * silu'(gate), dy * silu(gate)]."""
    gate, up = h.float().chunk(2, dim=-1)
    dy = dy.float()
    sig = torch.sigmoid(gate)
    silu = gate * sig
    dgate = dy * up * sig * (1 + gate * (1 - sig))
    return torch.cat([dgate, dy * silu], dim=-1)


def swiglu_fp8_forward_reference(h2: torch.Tensor, scale_format: str, fmt: str):
    """(swiglu(h2), h2's FP8 data, its 1x128 scales [M, 2F/128]) for h2 [M, 2F]."""
    q = quantize_token_ref(h2, get_format(fmt), scale_format)
    return swiglu(h2), q.data, q.scale


def swiglu_fp8_backward_reference(data: torch.Tensor, scale: torch.Tensor, dy2: torch.Tensor, out_dtype: torch.dtype,
                                  scale_format: str, fmt: str) -> torch.Tensor:
    """dL/dh [M, 2F] in out_dtype from the FP8 copy of h (data, scale) and dy2 [M, F]."""
    h = dequantize(QTensor(data, scale, "token", scale_format, fmt))
    return swiglu_backward(h, dy2).to(out_dtype)


def token_both_layouts(y: torch.Tensor, scale_format: str, fmt: str):
    """(q, its scales, q^T, its scales): y quantized per 1x128 token along its last dim and along its
    first (y^T along K), the operands a fused SwiGLU kernel writes for the next GEMMs."""
    a = quantize_reference(y, "token", scale_format, fmt)
    b = quantize_reference(y.t(), "token", scale_format, fmt)
    return a.data, a.scale, b.data, b.scale


def swiglu_fp8_forward_quantized_reference(h2: torch.Tensor, h_scale_format: str, h_fmt: str, scale_format: str,
                                           fmt: str):
    """(h2's FP8 data, its scales, then y = swiglu(h2) in h2's dtype in both token layouts)."""
    y, qh, sh = swiglu_fp8_forward_reference(h2, h_scale_format, h_fmt)
    return (qh, sh, *token_both_layouts(y, scale_format, fmt))


def swiglu_fp8_backward_quantized_reference(data: torch.Tensor, scale: torch.Tensor, dy2: torch.Tensor,
                                            h_scale_format: str, h_fmt: str, scale_format: str, fmt: str):
    """dL/dh in bf16 (swiglu_fp8_backward_reference) in both token layouts."""
    dh = swiglu_fp8_backward_reference(data, scale, dy2, torch.bfloat16, h_scale_format, h_fmt)
    return token_both_layouts(dh, scale_format, fmt)
