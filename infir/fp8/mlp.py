"""The SwiGLU MLP  out = FC2(swiglu(FC1(x)))  of a token-granular FP8 recipe as one autograd Function.

Why one Function and not three: between FC1, SwiGLU and FC2 the unfused path hands over BF16 tensors,
y = swiglu(h) forward and dh backward, and each is then re-read to be quantized in both layouts for
the next GEMMs (1x128 for fprop/dgrad, 128x1 transposed for wgrad). Those two are the widest tensors
of a layer (F and 2F values a token against the hidden size's H): at Qwen2.5-1.5B their quantization
was ~73% of the bytes the FP8 step quantized and ~8% of its time. Here SwiGLU's kernels write the FP8
operands directly (kernels/swiglu.py: swiglu_quant_fwd / swiglu_quant_bwd) and y and dh never exist
in BF16.

Bits: the same as the unfused path (traced.TracedFp8Linear -> swiglu.SwiGLUFp8Input ->
TracedFp8Linear) — the same GEMM ops, h saved for the backward in the same FP8 copy, and y and dh
rounded to the activation dtype before they are quantized, as the unfused path rounds them.
Recipes whose activations and gradients are both per token (1x128: fp8_blockwise_ue8m0 / _fp32)
qualify (`fusable`); the per-tensor and two-level recipes need a global or per-row pass first
and keep the unfused path. Callers handle tensor parallelism around it (infir.model.fp8_mlp).
"""
from __future__ import annotations

import torch

from .formats import get_format
from .oplib import define_op
from .quantize import QTensor, dequantize, quantize_token_ref
from .recipe import Recipe
from .swiglu import swiglu, swiglu_backward
from .swiglu import _fwd_fake as _swiglu_fwd_fake
from .traced import _quantize_pair, _quantize_pair_fake, fp8_mm, quantize_pair

_TOKEN = "token"


def fusable(recipe: Recipe) -> bool:
    return recipe.activation == _TOKEN and recipe.grad == _TOKEN


def _kernels_for(width: int, dtype: torch.dtype, device: torch.device) -> bool:
    from .kernels import swiglu as ks

    return ks.supported_shape(width, dtype, device)


def _fwd(h2: torch.Tensor, scale_format: str, fmt: str):
    if _kernels_for(h2.shape[1], h2.dtype, h2.device):
        from .kernels.swiglu import swiglu_quant_fwd

        (hq, hs), (q, s, qt, st) = swiglu_quant_fwd(h2, scale_format, fmt)
        return hq, hs, q, s, qt, st
    saved = quantize_token_ref(h2, get_format(fmt), scale_format)
    return (saved.data, saved.scale) + _quantize_pair(swiglu(h2), _TOKEN, scale_format, fmt, True)


def _fwd_fake(h2, scale_format, fmt):
    y, hq, hs = _swiglu_fwd_fake(h2, scale_format, fmt)
    return (hq, hs) + _quantize_pair_fake(y, _TOKEN, scale_format, fmt, True)


def _bwd(hq: torch.Tensor, hs: torch.Tensor, dy2: torch.Tensor, out_dtype: torch.dtype, scale_format: str, fmt: str):
    if _kernels_for(hq.shape[1], out_dtype, hq.device) and dy2.dtype == out_dtype:
        from .kernels.swiglu import swiglu_quant_bwd

        return swiglu_quant_bwd(hq, hs, dy2, out_dtype, scale_format, fmt)
    h = dequantize(QTensor(hq, hs, _TOKEN, scale_format, fmt))
    return _quantize_pair(swiglu_backward(h, dy2).to(out_dtype), _TOKEN, scale_format, fmt, True)


def _bwd_fake(hq, hs, dy2, out_dtype, scale_format, fmt):
    return _quantize_pair_fake(hq.new_empty(hq.shape, dtype=out_dtype), _TOKEN, scale_format, fmt, True)


swiglu_quant_fwd = define_op(
    "swiglu_quant_fwd", "(Tensor h2, str scale_format, str fmt) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    _fwd, _fwd_fake)
swiglu_quant_bwd = define_op(
    "swiglu_quant_bwd", "(Tensor hq, Tensor hs, Tensor dy2, ScalarType out_dtype, str scale_format, str fmt) "
    "-> (Tensor, Tensor, Tensor, Tensor)", _bwd, _bwd_fake)


class Fp8SwiGLUMLP(torch.autograd.Function):
    """out = (swiglu(x W1^T)) W2^T, every GEMM FP8 (fprop, dgrad, wgrad), activations and gradients 1x128.

    Inputs: x [M, H]; per weight: the master weight (for its gradient's dtype and shape), its FP8
    data and scale, and its scaled_mm scale layouts for W and W^T (or None), as traced.TracedFp8Linear
    takes them; then the weights' granularity, the scale format and the FP8 format.
    """

    @staticmethod
    def forward(ctx, x, w1, q1, s1, mm1, mm1_t, w2, q2, s2, mm2, mm2_t, w_gran: str, scale_format: str, fmt: str):
        need_w1, need_w2 = ctx.needs_input_grad[1], ctx.needs_input_grad[6]
        (qx, sx, _), xt = quantize_pair(x, _TOKEN, scale_format, fmt, cols=need_w1)
        h = fp8_mm(qx, sx, _TOKEN, q1, s1, w_gran, x.dtype, False, mm1)
        hq, hs, qy, sy, qyt, syt = swiglu_quant_fwd(h, scale_format, fmt)
        out = fp8_mm(qy, sy, _TOKEN, q2, s2, w_gran, x.dtype, False, mm2)
        # Saved in a fixed order with flags for the optional ones: dynamo broke the graph on a list.pop().
        ctx.has_mm_t = mm1_t is not None and mm2_t is not None
        saved = [q1, s1, q2, s2, hq, hs] + ([mm1_t, mm2_t] if ctx.has_mm_t else [])
        saved += ([qyt, syt] if need_w2 else []) + ([xt[0], xt[1]] if need_w1 else [])
        ctx.save_for_backward(*saved)
        ctx.meta = (w_gran, scale_format, fmt, x.dtype, w1.dtype, w2.dtype)
        return out

    @staticmethod
    def backward(ctx, dout):
        w_gran, scale_format, fmt, x_dtype, w1_dtype, w2_dtype = ctx.meta
        need_dx, need_w1, need_w2 = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[6]
        saved = ctx.saved_tensors
        q1, s1, q2, s2, hq, hs = saved[:6]
        i = 6
        mm1_t = mm2_t = None
        if ctx.has_mm_t:
            mm1_t, mm2_t = saved[6], saved[7]
            i = 8
        (qd, sd, _), dt = quantize_pair(dout, _TOKEN, scale_format, fmt, cols=need_w2)
        dy = fp8_mm(qd, sd, _TOKEN, q2, s2, w_gran, x_dtype, True, mm2_t)
        dw2 = None
        if need_w2:
            dw2 = fp8_mm(dt[0], dt[1], _TOKEN, saved[i], saved[i + 1], _TOKEN, w2_dtype)
            i += 2
        qdh, sdh, qdht, sdht = swiglu_quant_bwd(hq, hs, dy, x_dtype, scale_format, fmt)
        dx = fp8_mm(qdh, sdh, _TOKEN, q1, s1, w_gran, x_dtype, True, mm1_t) if need_dx else None
        dw1 = fp8_mm(qdht, sdht, _TOKEN, saved[i], saved[i + 1], _TOKEN, w1_dtype) if need_w1 else None
        return dx, dw1, None, None, None, None, dw2, None, None, None, None, None, None, None


def fp8_swiglu_mlp(x: torch.Tensor, w1: torch.Tensor, wq1: QTensor, w2: torch.Tensor, wq2: QTensor,
                   recipe: Recipe) -> torch.Tensor:
    """FC2(swiglu(FC1(x))) for x [..., H], w1 [2F, H] (gate rows, then up), w2 [H', F], under a
    `fusable` recipe, from the weights' cached FP8 operands (WeightCache.get, made outside any compiled
    region; traced.traced_linear takes them the same way)."""
    if not fusable(recipe):
        raise ValueError(f"recipe {recipe.name!r} quantizes activations per {recipe.activation} and gradients per "
                         f"{recipe.grad}; the fused MLP needs both per token (1x128): use the unfused layers")
    if wq1.granularity != wq2.granularity:
        raise ValueError(f"FC1 and FC2 weights are quantized per {wq1.granularity} and per {wq2.granularity}; "
                         "the fused MLP takes one weight granularity")
    k = x.shape[-1]
    lc1, lc2 = wq1.layout_cache, wq2.layout_cache
    out = Fp8SwiGLUMLP.apply(x.reshape(-1, k), w1, wq1.data, wq1.scale, lc1.get("scaled_mm"), lc1.get("scaled_mm_t"),
                             w2, wq2.data, wq2.scale, lc2.get("scaled_mm"), lc2.get("scaled_mm_t"),
                             wq1.granularity, recipe.scale_format, recipe.fmt)
    return out.reshape(*x.shape[:-1], out.shape[-1])
