"""The FP8 linear: Y = X W^T with fprop, dgrad and wgrad all as FP8 GEMMs, in one autograd Function.

Each operand is quantized along the dimension its GEMM contracts (recipe.py names the formats):
    fprop  Y  = X  W^T      X  along K      W   per the recipe's weight format
    dgrad  dX = dY W        dY along N      W^T = the *same* blocks as W
    wgrad  dW = dY^T X      dY^T, X^T along the tokens
X is quantized in fprop into both layouts by one launch and only X^T is kept for backward, in FP8
(half the bytes of saving X in BF16); dY likewise in backward. The weight is quantized once per
optimizer step by a WeightCache and comes in as tensors (its data, scales and scaled_mm's scale
layouts), because a compiled graph cannot hold the cache's bookkeeping.

One Function serves every caller: eager code, compiled layers (its quantizers and GEMMs are opaque
graph ops, ops.py, so dynamo keeps a layer as one graph; launched from Python between graph breaks, a
compiled 1.5B FP8 step waited on the host), any parallelism (a comm.py strategy moves the operands:
nothing, or the sequence-parallel FP8 all-gather and reduce-scatter, split per rank around the GEMMs), and
megatron's FP32 `main_grad` (wgrad adds into it).
What a call computes is one frozen `LinearSpec`; what backward needs besides tensors, one frozen `_Saved`.

SwiGLU epilogue (a gated FC1 whose output goes through SwiGLU): h = X W^T is saved in FP8 for SwiGLU's
backward (swiglu.py), and the backward turns dY of swiglu(h) into FC1's FP8 gradient operands directly
(one fused kernel where it applies). With `fp8_out` the output is not even written in the compute dtype:
y = swiglu(h) leaves as FC2's FP8 operands (an `Fp8SwiGLUOutput`), which FC2's call takes as its input.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .comm import LOCAL, Local, SequenceParallel, SequenceParallelOutput
from .ops import fp8_mm, fp8_wgrad_main_grad, gemm_granularity, quantize_operand
from .recipe import OperandFormat, Recipe, get_recipe
from .swiglu import (fused_backward_quantize_ok, fused_forward_quantize_ok, swiglu_fp8_backward,
                     swiglu_fp8_backward_quantized, swiglu_fp8_forward, swiglu_fp8_forward_quantized)
from .weight_cache import WeightCache


@dataclass(frozen=True)
class LinearSpec:
    """What one FP8 linear call computes (dynamo specialises a compiled layer on it).

    input, grad_output: the recipe's operand formats; weight_granularity: that of the cached FP8 weight.
    comm: comm.LOCAL, a comm.SequenceParallel (then x is this rank's shard of the sequence and Y
    covers the whole sequence) or a comm.SequenceParallelOutput (x covers the sequence, Y is this rank's
    shard of the sum over ranks). to_main_grad: the weight has megatron's FP32 `main_grad` and its grad
    hook skips what autograd gets (`grad_added_to_main_grad`): wgrad adds into main_grad itself.
    swiglu: the SwiGLU epilogue's saved-input format, or None; fp8_out (with swiglu): Y leaves as FC2's
    FP8 operands (Fp8SwiGLUOutput)."""

    input: OperandFormat
    grad_output: OperandFormat
    weight_granularity: str
    comm: Local | SequenceParallel | SequenceParallelOutput
    to_main_grad: bool = False
    swiglu: OperandFormat | None = None
    fp8_out: bool = False

    @classmethod
    def of(cls, recipe: Recipe, weight_granularity: str, comm=LOCAL, **kw) -> "LinearSpec":
        return cls(recipe.input, recipe.grad_output, weight_granularity, comm, **kw)


@dataclass(frozen=True)
class _Saved:
    """What the backward needs besides the saved tensors (whose names are `names`)."""

    spec: LinearSpec
    names: tuple
    x_dtype: torch.dtype
    w_dtype: torch.dtype
    need_dgrad: bool
    need_wgrad: bool
    need_bias_grad: bool
    to_main_grad: bool


class Fp8SwiGLUOutput(NamedTuple):
    """FC1's output where SwiGLU is its epilogue and FC2 takes y in FP8 (LinearSpec.fp8_out): y's FP8
    operands for FC2 (along F, and y^T along the tokens for FC2's wgrad), and `anchor`, a tensor of y's
    shape and dtype, never written, that carries y's gradient from FC2 back to FC1 for autograd.
    megatron's MLP hands it from FC1 to FC2 untouched (its activation is then the identity)."""

    anchor: torch.Tensor
    q: torch.Tensor
    scale: torch.Tensor
    qt: torch.Tensor
    scale_t: torch.Tensor


class Fp8LinearFunction(torch.autograd.Function):
    """Inputs: x [M, K] (the compute dtype; only y's anchor when its operands come pre-quantized), weight
    [N, K] (for its gradient's dtype and main_grad), w / w_scale (W quantized), w_mm / w_mm_t (W's and
    W^T's scales in scaled_mm's layout, or None), bias or None, x's pre-quantized operands (FC2 after
    FC1's FP8 output: q, scale, q^T, scale^T) or four Nones, and the LinearSpec.
    Returns y [comm.rows(M), N], or (anchor, q, scale, q^T, scale^T) with spec.fp8_out."""

    @staticmethod
    def forward(ctx, x, weight, w, w_scale, w_mm, w_mm_t, bias, xq, xs, xqt, xst, spec: LinearSpec):
        need_wgrad = ctx.needs_input_grad[1]
        gran = gemm_granularity(spec.input.granularity)
        if xq is None:
            (qx, sx, _), xt = quantize_operand(x, spec.input, cols=need_wgrad)
        else:
            qx, sx, xt = xq, xs, (None if xqt is None else (xqt, xst, gran))
        # under sequence parallelism X^T's shards stay local until backward
        h = spec.comm.forward_mm(qx, sx, gran, w, w_scale, spec.weight_granularity, x.dtype, w_mm)
        if bias is not None:
            h = h + bias.to(h.dtype)
        saved = {"w": w, "w_scale": w_scale, "w_mm_t": w_mm_t}
        to_main_grad = spec.to_main_grad and need_wgrad
        if to_main_grad:
            saved["weight"] = weight
        if need_wgrad and xt is not None:
            saved["xt"], saved["xt_scale"] = xt[0], xt[1]
        out = _epilogue(ctx, h, spec, saved)
        saved = {k: t for k, t in saved.items() if t is not None}
        ctx.state = _Saved(spec, tuple(saved), x.dtype, weight.dtype, ctx.needs_input_grad[0], need_wgrad,
                           bias is not None and ctx.needs_input_grad[6], to_main_grad)
        ctx.save_for_backward(*saved.values())
        return out

    @staticmethod
    def backward(ctx, dy, *_):
        st: _Saved = ctx.state
        comm = st.spec.comm
        saved = dict(zip(st.names, ctx.saved_tensors))
        if isinstance(comm, SequenceParallelOutput):
            dx, dw = _backward_output_scattered(st, saved, dy, comm)
            return (dx, dw, None, None, None, None, None) + (None,) * 5
        if isinstance(comm, SequenceParallel) and comm.overlap:
            dx, dw = _backward_input_gathered_split(st, saved, dy, comm)
            db = dy.float().sum(0) if st.need_bias_grad else None
            return (dx, dw, None, None, None, None, db) + (None,) * 5
        # megatron's order under sequence parallelism: X^T's shards are gathered around dY's
        # quantization and dgrad, and dX's reduce-scatter around wgrad
        pending = comm.gather_start((saved["xt"], saved["xt_scale"]), 1) if st.need_wgrad else None
        (qdy, sdy, gdy), dyt = _grad_operands(st, saved, dy)
        dx = dw = db = None
        if st.need_dgrad:
            dx = fp8_mm(qdy, sdy, gdy, saved["w"], saved["w_scale"], st.spec.weight_granularity, st.x_dtype, True,
                        saved.get("w_mm_t"))
            dx = comm.reduce_scatter_start(dx)
        if st.need_wgrad:
            dw = _wgrad(st, saved, dyt, *comm.gather_wait(pending))
        if dx is not None:
            dx = comm.reduce_scatter_wait(dx)
        if st.need_bias_grad:
            db = dy.float().sum(0)
        return (dx, dw, None, None, None, None, db) + (None,) * 5


def _backward_input_gathered_split(st: _Saved, saved: dict, dy: torch.Tensor, comm: SequenceParallel):
    """(dX, dW) of a column-parallel linear whose input was gathered (SequenceParallel with overlap): dX's
    reduce-scatter split per rank around dgrad, X^T's gather split per rank around wgrad."""
    (qdy, sdy, gdy), dyt = _grad_operands(st, saved, dy)
    dx = dw = None
    if st.need_dgrad:
        dx = comm.dgrad_mm(qdy, sdy, gdy, saved["w"], saved["w_scale"], st.spec.weight_granularity, st.x_dtype,
                           saved.get("w_mm_t"))
    if st.need_wgrad:
        dw = _wgrad(st, saved, dyt, saved["xt"], saved["xt_scale"], comm)
    return dx, dw


def _wgrad(st: _Saved, saved: dict, dyt, xt: torch.Tensor, xt_scale: torch.Tensor, split=None):
    """dW = dY^T (X^T)^T from both operands along the tokens: added into main_grad (then an unwritten
    placeholder or None is returned), or in the weight's dtype for autograd. `split`: a SequenceParallel
    strategy whose X^T shards are gathered per rank around the wgrad GEMMs (xt is this rank's shard)."""
    xt_gran = gemm_granularity(st.spec.input.granularity)
    if split is not None:
        dw = split.gather_wgrad(dyt[0], dyt[1], dyt[2], xt, xt_scale, xt_gran, saved.get("weight"))
        if not st.to_main_grad:
            return dw.to(st.w_dtype)
    elif not st.to_main_grad:
        return fp8_mm(dyt[0], dyt[1], dyt[2], xt, xt_scale, xt_gran, st.w_dtype)
    else:
        dw = fp8_wgrad_main_grad(dyt[0], dyt[1], dyt[2], xt, xt_scale, xt_gran, saved["weight"])
    # dw is the op's unwritten placeholder. A compiled graph needs it, or it prunes the op; megatron
    # DDP's grad hook needs a .grad to be there (overlap_grad_reduce asserts it), skips adding it
    # (grad_added_to_main_grad) and drops it. Elsewhere the weight's .grad stays None: it is all in
    # main_grad, and no hook would drop an unwritten tensor an optimizer might then read.
    if not (torch.compiler.is_compiling() or getattr(saved["weight"], "grad_added_to_main_grad", False)):
        return None
    return dw


def _backward_output_scattered(st: _Saved, saved: dict, dy: torch.Tensor, comm: SequenceParallelOutput):
    """(dX, dW) of a row-parallel linear whose output was reduce-scattered: dy is this rank's shard. Its
    FP8 operands are quantized here and gathered, dY per rank around dgrad and dY^T with it for wgrad
    (the backward of the reduce-scatter is an all-gather, in FP8 here rather than BF16)."""
    (qdy, sdy, gdy), dyt = _grad_operands(st, saved, dy)
    extra = [dyt[0], dyt[1]] if st.need_wgrad else []
    dx = None
    if st.need_dgrad:
        dx, extra = comm.gather_dgrad(qdy, sdy, gdy, saved["w"], saved["w_scale"], st.spec.weight_granularity,
                                      st.x_dtype, saved.get("w_mm_t"), extra)
    elif extra:
        extra = comm.gather(extra)
    dw = _wgrad(st, saved, (*extra, dyt[2]), saved["xt"], saved["xt_scale"]) if st.need_wgrad else None
    return dx, dw


def _epilogue(ctx, h: torch.Tensor, spec: LinearSpec, saved: dict):
    """The Function's output from h = X W^T (+ bias): h itself, swiglu(h) with h saved in FP8, or
    swiglu(h)'s FP8 operands for FC2 with y's anchor."""
    if spec.swiglu is None:
        return h
    sw = spec.swiglu
    if not spec.fp8_out:
        y, saved["qh"], saved["sh"] = swiglu_fp8_forward(h, sw.scale_format, sw.fmt)
        return y
    fmt = spec.input
    if fmt.granularity == "token" and fused_forward_quantize_ok(h):
        saved["qh"], saved["sh"], q, s, qt, st = swiglu_fp8_forward_quantized(
            h, sw.scale_format, sw.fmt, fmt.scale_format, fmt.fmt)
    else:
        y, saved["qh"], saved["sh"] = swiglu_fp8_forward(h, sw.scale_format, sw.fmt)
        (q, s, _), (qt, st, _) = quantize_operand(y, fmt, cols=True)
    ctx.mark_non_differentiable(q, s, qt, st)
    # y's gradient arrives here through the anchor; FC2 never reads it, so it is never written
    return h.new_empty((h.shape[0], h.shape[1] // 2)), q, s, qt, st


def _grad_operands(st: _Saved, saved: dict, dy: torch.Tensor):
    """The GEMM operands of the output gradient: dY quantized along N, and dY^T along the tokens when
    wgrad needs it. With the SwiGLU epilogue, dy is the gradient of swiglu(h), and the operands are those
    of dh: one fused kernel (no dh in memory) where it applies, else dh, then quantized."""
    fmt, cols = st.spec.grad_output, st.need_wgrad
    if st.spec.swiglu is None:
        return quantize_operand(dy, fmt, cols)
    qh, sh = saved["qh"], saved["sh"]
    if fmt.granularity == "token" and cols and fused_backward_quantize_ok(qh, dy, st.x_dtype):
        q, s, qt, sct = swiglu_fp8_backward_quantized(qh, sh, dy, fmt.scale_format, fmt.fmt)
        return (q, s, "token"), (qt, sct, "token")
    sw = st.spec.swiglu
    dh = swiglu_fp8_backward(qh, sh, dy, st.x_dtype, sw.scale_format, sw.fmt)
    return quantize_operand(dh, fmt, cols)


def fp8_linear(x, weight: torch.Tensor, wq, bias: torch.Tensor | None, spec: LinearSpec):
    """x [..., K] @ weight^T under `spec`, from the weight's cached FP8 operand (wq: WeightCache.get).

    x may be an Fp8SwiGLUOutput (FC1's FP8 output), taken as is: the recipe's input format, no
    communication. With spec.fp8_out the result is an Fp8SwiGLUOutput; else y [..., N], whose leading
    dim covers every rank's shard under sequence parallelism."""
    if spec.swiglu is not None and bias is not None:
        raise ValueError("the FP8 linear's SwiGLU epilogue takes no bias (its backward never forms dh for the bias "
                         "gradient); apply swiglu.swiglu_fp8_input after the linear instead")
    if spec.fp8_out and spec.swiglu is None:
        raise ValueError("fp8_out is the SwiGLU epilogue's FP8 output: give the spec a swiglu format too")
    w_mm, w_mm_t = wq.layout_cache.get("scaled_mm"), wq.layout_cache.get("scaled_mm_t")
    pre = (None,) * 4
    if isinstance(spec.comm, SequenceParallelOutput) and (bias is not None or spec.swiglu is not None):
        raise ValueError("a row-parallel linear with a reduce-scattered output takes its bias after the reduction "
                         "and has no SwiGLU epilogue: pass bias=None and no swiglu format")
    if isinstance(x, Fp8SwiGLUOutput):
        if isinstance(spec.comm, SequenceParallel) or spec.swiglu is not None:
            raise ValueError("an FP8 SwiGLU output goes into a row-parallel linear (FC2), without sequence-parallel "
                             "gather or an epilogue of its own")
        pre, x = (x.q, x.scale, x.qt, x.scale_t), x.anchor
    k = x.shape[-1]
    lead = (spec.comm.rows(x.shape[0]), *x.shape[1:-1])
    out = Fp8LinearFunction.apply(x.reshape(-1, k), weight, wq.data, wq.scale, w_mm, w_mm_t, bias, *pre, spec)
    if spec.fp8_out:
        anchor, q, s, qt, st = out
        return Fp8SwiGLUOutput(anchor.reshape(*lead, anchor.shape[-1]), q, s, qt, st)
    return out.reshape(*lead, out.shape[-1])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           recipe: str | Recipe = "fp8_blockwise_ue8m0", weight_cache: WeightCache | None = None) -> torch.Tensor:
    """F.linear under a precision recipe: x [..., K], weight [N, K] (bf16 or fp32 master) -> [..., N] in x.dtype.

    weight_cache: keep one per layer to quantize the weight once per optimizer step (without one
    the weight is quantized on every call). Where the weight has a float32 `main_grad` (megatron's
    gradient-accumulation buffer) wgrad adds into it (FP32 accumulation, in place on Hopper) and
    autograd gets no dW; otherwise dW comes back in the weight's dtype."""
    recipe = get_recipe(recipe)
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(f"linear: x has K={x.shape[-1]} but weight is {tuple(weight.shape)} ([N, K])")
    if not recipe.fp8:
        return F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
    cache = weight_cache if weight_cache is not None else WeightCache()
    wq = cache.get(weight, recipe)
    spec = LinearSpec.of(recipe, wq.granularity, to_main_grad=hasattr(weight, "main_grad"))
    return fp8_linear(x, weight, wq, bias, spec)


class Fp8Linear(torch.nn.Module):
    """nn.Linear under a recipe, with its own WeightCache (call .weight_cache.step(lr) after each optimizer step)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, recipe: str | Recipe = "fp8_blockwise_ue8m0",
                 device=None, dtype=None):
        super().__init__()
        ref = torch.nn.Linear(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.weight, self.bias = ref.weight, ref.bias
        self.recipe = get_recipe(recipe)
        self.weight_cache = WeightCache()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.recipe, self.weight_cache)
