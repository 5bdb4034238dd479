"""SwiGLU whose input is kept for the backward in FP8 (1x128 blocks) instead of BF16.

Why: in a Qwen2.5 layer under an FP8 recipe, the FC1 output h = [gate, up] (2 x ffn values a token)
is the largest tensor saved for the backward: the FP8 linears save their inputs as 1-byte operands,
and h in BF16 is over half of what a layer keeps (at 1.5B, 2 x 8960 x 2 B = 35.8 KB a token of the
~71 KB that bench/step.py's saved_act_GiB works out to: 15.3 GiB over 28 layers x 8192 tokens). SwiGLU's
backward needs h itself, so it is stored as E4M3 with one scale per 128 values along the feature
dim and dequantized there: half the bytes, as DeepSeek-V3 caches its SwiGLU inputs (its §3.3). The
forward output is computed from the exact h, so only the backward sees the rounding; what it
produces, dh, is quantized to FP8 by FC1's backward anyway.

On CUDA (and in Triton's interpreter) two Triton kernels run it (kernels/swiglu.py: one pass over h
forward, one over the FP8 copy backward), as opaque ops (oplib.py) so that a compiled layer keeps them whole;
elsewhere, and for ffn sizes not a multiple of 128, the torch reference (swiglu_reference.py). Where FC1 runs in FP8 and
SwiGLU is its epilogue (infir.fp8.linear), the backward goes straight to FC1's FP8 gradient operands
(swiglu_fp8_backward_quantized): dh is never written in bf16; and the forward straight to FC2's FP8
input operands (swiglu_fp8_forward_quantized): nor is y.
"""
from __future__ import annotations

import torch

from .formats import get_format
from .oplib import define_op
from .quantize import TOKEN_BLOCK
from .swiglu_reference import swiglu, swiglu_backward, swiglu_fp8_backward_reference, swiglu_fp8_forward_reference

__all__ = ["SwiGLUFp8Input", "fused_backward_quantize_ok", "fused_forward_quantize_ok", "swiglu", "swiglu_backward",
           "swiglu_fp8_backward", "swiglu_fp8_backward_quantized", "swiglu_fp8_forward", "swiglu_fp8_forward_quantized",
           "swiglu_fp8_input"]


def _fwd(h2: torch.Tensor, scale_format: str, fmt: str):
    from .kernels.swiglu import swiglu_fp8_fwd

    return swiglu_fp8_fwd(h2, scale_format, fmt)


def _fwd_fake(h2, scale_format, fmt):
    m, k = h2.shape
    return (h2.new_empty((m, k // 2)), h2.new_empty((m, k), dtype=get_format(fmt).dtype),
            h2.new_empty((m, k // TOKEN_BLOCK), dtype=torch.float32))


def _bwd(q: torch.Tensor, scale: torch.Tensor, dy2: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    from .kernels.swiglu import swiglu_fp8_bwd

    return swiglu_fp8_bwd(q, scale, dy2, out_dtype)


def _bwd_quant(q: torch.Tensor, scale: torch.Tensor, dy2: torch.Tensor, scale_format: str, fmt: str):
    from .kernels.swiglu import swiglu_fp8_bwd_quant

    return swiglu_fp8_bwd_quant(q, scale, dy2, scale_format, fmt)


def _bwd_quant_fake(q, scale, dy2, scale_format, fmt):
    m, k = q.shape  # the token quantizers' outer-dim-major scale views
    dt, f32 = get_format(fmt).dtype, torch.float32
    return (q.new_empty((m, k), dtype=dt), q.new_empty((k // TOKEN_BLOCK, m), dtype=f32).t(),
            q.new_empty((k, m), dtype=dt), q.new_empty((m // TOKEN_BLOCK, k), dtype=f32).t())


def _fwd_quant(h2: torch.Tensor, h_scale_format: str, h_fmt: str, scale_format: str, fmt: str):
    from .kernels.swiglu import swiglu_fp8_fwd_quant

    return swiglu_fp8_fwd_quant(h2, h_scale_format, h_fmt, scale_format, fmt)


def _fwd_quant_fake(h2, h_scale_format, h_fmt, scale_format, fmt):
    m, k = h2.shape
    _, qh, sh = _fwd_fake(h2, h_scale_format, h_fmt)
    return (qh, sh, *_bwd_quant_fake(h2.new_empty((m, k // 2), dtype=get_format(fmt).dtype), None, None, scale_format, fmt))


_fwd_op = define_op("swiglu_fp8_fwd", "(Tensor h2, str scale_format, str fmt) -> (Tensor, Tensor, Tensor)", _fwd, _fwd_fake)
_bwd_op = define_op("swiglu_fp8_bwd", "(Tensor q, Tensor scale, Tensor dy2, ScalarType out_dtype) -> Tensor", _bwd,
                    lambda q, scale, dy2, out_dtype: q.new_empty(q.shape, dtype=out_dtype))
_fwd_quant_op = define_op("swiglu_fp8_fwd_quant", "(Tensor h2, str h_scale_format, str h_fmt, str scale_format, "
                          "str fmt) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)", _fwd_quant, _fwd_quant_fake)
_bwd_quant_op = define_op("swiglu_fp8_bwd_quant", "(Tensor q, Tensor scale, Tensor dy2, str scale_format, str fmt) "
                          "-> (Tensor, Tensor, Tensor, Tensor)", _bwd_quant, _bwd_quant_fake)


def _use_kernels(h: torch.Tensor) -> bool:
    from .kernels import swiglu as ks

    return ks.supported(h.reshape(-1, h.shape[-1]))


def swiglu_fp8_forward(h2: torch.Tensor, scale_format: str, fmt: str):
    """(swiglu(h2), h2's FP8 data, its 1x128 scales [M, 2F/128] row-major) for h2 [M, 2F]: the Triton
    kernel where it applies, else the reference."""
    if _use_kernels(h2):
        return _fwd_op(h2, scale_format, fmt)
    return swiglu_fp8_forward_reference(h2, scale_format, fmt)


def fused_forward_quantize_ok(h2: torch.Tensor) -> bool:
    """Whether swiglu_fp8_forward_quantized takes h2 (fused by kernels/quant_both.cu where it is
    built). Trace-safe: shapes, dtypes and devices only."""
    from .kernels.swiglu import fwd_quant_ok

    return fwd_quant_ok(h2)


def swiglu_fp8_forward_quantized(h2: torch.Tensor, h_scale_format: str, h_fmt: str, scale_format: str, fmt: str):
    """swiglu_fp8_forward(h2, ...) with y quantized per token in both layouts by one kernel that never
    writes y: (h2's FP8 data, its scales, y's q [M, F], its scales, q^T [F, M], its scales), y's as the
    token quantizers lay them out. Only where fused_forward_quantize_ok."""
    return _fwd_quant_op(h2, h_scale_format, h_fmt, scale_format, fmt)


def swiglu_fp8_backward(data: torch.Tensor, scale: torch.Tensor, dy2: torch.Tensor, out_dtype: torch.dtype,
                        scale_format: str, fmt: str) -> torch.Tensor:
    """dL/dh [M, 2F] in out_dtype from swiglu_fp8_forward's FP8 copy of h and dy2 [M, F]."""
    if _use_kernels(data):
        return _bwd_op(data, scale, dy2, out_dtype)
    return swiglu_fp8_backward_reference(data, scale, dy2, out_dtype, scale_format, fmt)


def fused_backward_quantize_ok(data: torch.Tensor, dy2: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Whether swiglu_fp8_backward_quantized takes these operands (fused by kernels/quant_both.cu
    where it is built). Trace-safe: shapes, dtypes and devices only."""
    from .kernels.swiglu import bwd_quant_ok

    return bwd_quant_ok(data, dy2, out_dtype)


def swiglu_fp8_backward_quantized(data: torch.Tensor, scale: torch.Tensor, dy2: torch.Tensor, scale_format: str,
                                  fmt: str):
    """swiglu_fp8_backward(..., bf16) quantized per token in both layouts, by one kernel that never
    writes dh: (q [M, 2F], its scales, q^T [2F, M], its scales) as the token quantizers lay them out.
    Only where fused_backward_quantize_ok."""
    return _bwd_quant_op(data, scale, dy2, scale_format, fmt)


class SwiGLUFp8Input(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, scale_format: str, fmt: str):
        ctx.qmeta = (scale_format, fmt, h.dtype, h.shape)
        y, q, s = swiglu_fp8_forward(h.reshape(-1, h.shape[-1]), scale_format, fmt)
        ctx.save_for_backward(q, s)
        return y.view(*h.shape[:-1], h.shape[-1] // 2)

    @staticmethod
    def backward(ctx, dy):
        data, scale = ctx.saved_tensors
        scale_format, fmt, dtype, shape = ctx.qmeta
        dh = swiglu_fp8_backward(data, scale, dy.reshape(-1, dy.shape[-1]), dtype, scale_format, fmt)
        return dh.view(shape), None, None


def swiglu_fp8_input(h: torch.Tensor, scale_format: str = "ue8m0", fmt: str = "e4m3") -> torch.Tensor:
    """swiglu(h), saving h for the backward as FP8 with one `scale_format` scale per 1x128 block."""
    return SwiGLUFp8Input.apply(h, scale_format, fmt)
