"""The FP8 linear as torch.compile sees it: one graph, with its quantizers and GEMMs as custom ops.

Why a second path beside linear.Fp8LinearFunction: called from Python inside a compiled layer, that
Function forces a graph break around every projection, and each break (guards, AOT wrappers, the
Function's own bookkeeping) costs host time: at Qwen2.5-1.5B the FP8 step took longer for the CPU to
issue than for the GPU to run, and ran at 0.57x of BF16 (BENCHMARKS.md). Here the linear is traceable: dynamo keeps
the layer as one graph, and the quantizers and GEMMs are opaque ops (`infir::fp8_quantize_pair`,
`infir::fp8_mm`, registered lean by oplib.py) over the same Triton kernels and scaled_mm as the eager
path, so the bits are the same. Their common case (token activations, block or token B on an sm90 GPU)
goes straight to the kernel and to one scaled_mm call with the weight's scale layouts made once a step:
every microsecond these ops spend on the host is spent ~20 times per layer and micro-batch.

Quantizing with torch ops instead, so that inductor fuses it into the norm or SwiGLU before it, was
tried and was slower end to end on an H100: inductor's code for the transposed 128x1 quantization
(X^T for wgrad) ran far under the Triton kernels' bandwidth.

Sequence parallelism: given the TP group's name, the linear quantizes the local sequence shard and
all-gathers the FP8 bytes + scales (X^T's for wgrad only in backward; dgrad reduce-scatters dX) as
functional collectives, which dynamo keeps inside the layer's graph; the eager path
(infir.model.fp8_linears.Fp8GatheredColumn) moves the same bytes from Python, where each projection
became a graph break.

The weight operand (W, quantized once per optimizer step by a WeightCache) comes in as tensors,
because a compiled graph cannot hold the cache's bookkeeping; whoever calls this keeps it fresh
(infir.model.fp8_linears refreshes it before every forward of the model). dgrad transposes its bytes
inside its GEMM op and frees them after, as the eager path does.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .formats import get_format
from .gemm import is_sm90, fp8_gemm, fp8_gemm_accumulate, outer_dim_major, scaled_mm_blockwise
from .linear import quantize_operand
from .oplib import define_op
from .quantize import TOKEN_BLOCK, QTensor, transposed
from .recipe import Recipe
from .swiglu import (fused_backward_quantize_ok, fused_forward_quantize_ok, swiglu_fp8_backward,
                     swiglu_fp8_backward_quantized, swiglu_fp8_forward, swiglu_fp8_forward_quantized)


def _fp8_mm(a: torch.Tensor, a_scale: torch.Tensor, a_gran: str, b: torch.Tensor, b_scale: torch.Tensor, b_gran: str,
            out_dtype: torch.dtype, b_transposed: bool = False, b_mm_scale: torch.Tensor | None = None) -> torch.Tensor:
    """C [M, N] = A [M, K] @ B [N, K]^T for FP8 data + scales of the given granularities (gemm.fp8_gemm).

    b_transposed: b is stored [K, N] (W for dgrad); its bytes are transposed here and freed after
    the GEMM. Inside this op, and not as an op of its own, because the partitioner runs an opaque op
    that needs only forward inputs in the forward and saves its output: W^T would then be made for
    every layer in the forward and held until its backward.
    b_mm_scale: a 'block' b's scale (of b^T when b_transposed) already in scaled_mm's layout
    (gemm.scaled_mm_scale, made once a step by the weight cache); with it, and token A on an sm90
    GPU, the GEMM is one scaled_mm call with no per-call layout work.
    """
    m, k = a.shape
    n = b.shape[1 if b_transposed else 0]
    fast = (a_gran == "token" and is_sm90(a) and m % 16 == 0 and k % 128 == 0 and n % 128 == 0
            and ((b_gran == "block" and b_mm_scale is not None) or (b_gran == "token" and not b_transposed)))
    if fast:
        bk = transposed(b) if b_transposed else b
        # token scales come from the quantize op, outer-dim-major as scaled_mm takes them
        return scaled_mm_blockwise(a, a_scale, bk, b_scale if b_gran == "token" else b_mm_scale, b_gran, out_dtype)
    # Inductor may hand over any strides; the GEMM wants K-major data (scale layouts are fixed in gemm.py).
    qa = QTensor(a.contiguous(), a_scale, a_gran)
    qb = QTensor(b.contiguous(), b_scale, b_gran)
    return fp8_gemm(qa, qb.t() if b_transposed else qb, out_dtype=out_dtype)


def _fp8_mm_fake(a, a_scale, a_gran, b, b_scale, b_gran, out_dtype, b_transposed=False, b_mm_scale=None):
    return a.new_empty((a.shape[0], b.shape[1 if b_transposed else 0]), dtype=out_dtype)


fp8_mm = define_op(
    "fp8_mm", "(Tensor a, Tensor a_scale, str a_gran, Tensor b, Tensor b_scale, str b_gran, ScalarType out_dtype, "
    "bool b_transposed=False, Tensor? b_mm_scale=None) -> Tensor", _fp8_mm, _fp8_mm_fake)


def _fp8_wgrad_main_grad(a: torch.Tensor, a_scale: torch.Tensor, a_gran: str, b: torch.Tensor, b_scale: torch.Tensor,
                         b_gran: str, weight: torch.Tensor) -> torch.Tensor:
    """weight.main_grad += A [N, M] @ B [K, M]^T (the wgrad product, gemm.fp8_gemm_accumulate), and an
    unwritten placeholder of the weight's shape for autograd, which megatron's grad hook skips
    (grad_added_to_main_grad, set by fp8_linears.attach_weight_refresh).

    main_grad is reached through the weight, not passed in: as a graph input cudagraph trees would
    copy it into a static buffer of their own, and the sum would land in the copy. The weight is a
    parameter (a static input), so the captured kernel writes the real buffer, whose address
    megatron never changes. The write is invisible to the compiler, which is safe because nothing in
    the graph reads main_grad; the placeholder output keeps the op from being pruned.
    """
    qa = QTensor(a if a.is_contiguous() else a.contiguous(), a_scale, a_gran)
    qb = QTensor(b if b.is_contiguous() else b.contiguous(), b_scale, b_gran)
    fp8_gemm_accumulate(qa, qb, weight.main_grad)
    return torch.empty_like(weight)


fp8_wgrad_main_grad = define_op(
    "fp8_wgrad_main_grad", "(Tensor a, Tensor a_scale, str a_gran, Tensor b, Tensor b_scale, str b_gran, Tensor weight) "
    "-> Tensor", _fp8_wgrad_main_grad, lambda a, a_scale, a_gran, b, b_scale, b_gran, weight: torch.empty_like(weight))


@functools.lru_cache(maxsize=None)
def _operand_recipe(granularity: str, scale_format: str, fmt: str) -> Recipe:
    """The Recipe quantize_operand reads its formats from, built (and validated) once per combination:
    the op below runs ~8 times per layer and micro-batch."""
    return Recipe("traced", activation=granularity, grad=granularity, scale_format=scale_format, fmt=fmt)


def _quantize_pair(x2: torch.Tensor, granularity: str, scale_format: str, fmt: str, cols: bool):
    q, qt = quantize_operand(x2, granularity, _operand_recipe(granularity, scale_format, fmt), rows=True, cols=cols)
    # The layouts the fake below promises (the Triton kernels' own; the CPU reference is normalised).
    scale = outer_dim_major(q.scale) if granularity == "token" else q.scale
    if qt is None:  # no wgrad operand wanted: empty placeholders keep the op's schema fixed
        return q.data.contiguous(), scale, q.data.new_empty(0), q.scale.new_empty(0)
    # an op's outputs may not alias each other: a per-tensor X^T shares X's 0-dim scale
    st = qt.scale.clone() if qt.scale is q.scale else qt.scale
    st = outer_dim_major(st) if granularity == "token" else st
    return q.data.contiguous(), scale, qt.data.contiguous(), st


def _quantize_pair_fake(x2, granularity, scale_format, fmt, cols):
    m, k = x2.shape
    dt = get_format(fmt).dtype
    if granularity == "tensor":
        s = x2.new_empty((), dtype=torch.float32)
    elif granularity == "token":  # the kernels' outer-dim-major scale views
        s = x2.new_empty((-(-k // TOKEN_BLOCK), m), dtype=torch.float32).t()
    else:  # two_level comes folded: one FP32 scale per row
        s = x2.new_empty((m, 1), dtype=torch.float32)
    if not cols:
        return x2.new_empty((m, k), dtype=dt), s, x2.new_empty(0, dtype=dt), s.new_empty(0)
    if granularity == "tensor":
        st = x2.new_empty((), dtype=torch.float32)
    elif granularity == "token":
        st = x2.new_empty((-(-m // TOKEN_BLOCK), k), dtype=torch.float32).t()
    else:
        st = x2.new_empty((k, 1), dtype=torch.float32)
    return x2.new_empty((m, k), dtype=dt), s, x2.new_empty((k, m), dtype=dt), st


_quantize_pair_op = define_op(
    "fp8_quantize_pair", "(Tensor x2, str granularity, str scale_format, str fmt, bool cols) "
    "-> (Tensor, Tensor, Tensor, Tensor)", _quantize_pair, _quantize_pair_fake)


def _operand_gran(granularity: str) -> str:
    """The GEMM's name for an activation granularity's operand (two-level comes folded to rows)."""
    return "row" if granularity == "two_level" else granularity


def quantize_pair(x2: torch.Tensor, granularity: str, scale_format: str, fmt: str, cols: bool):
    """(data, scale, granularity) of x2 along K, and of x2^T along M when `cols`: the operands of
    linear.quantize_operand (Triton on CUDA, the reference elsewhere), as one opaque op in a graph."""
    q, s, qt, st = _quantize_pair_op(x2, granularity, scale_format, fmt, cols)
    gran = _operand_gran(granularity)
    return (q, s, gran), ((qt, st, gran) if cols else None)


def _sp_gather_start(ts, dim: int, group: str, world: int) -> list:
    """Starts one all-gather of every rank's tensors ts (an FP8 operand's data and scales) over the
    sequence-parallel group, each to be concatenated along dim (0 or 1) in rank order by
    _sp_gather_wait; work issued between the two may overlap it. One coalesced collective, not one
    per tensor: each costs the host ~125 us (under the profiler), and a 7B FP8 step at TP=2 issued
    ~1500 of them and waited on the slower rank's host (bench/step.py --profile, rank1.log).

    Everything moves as bytes (collectives have no FP8 type). A transposed view (the outer-dim-major
    token scales) is gathered through its storage, so the result keeps the layout the GEMM op expects.
    """
    raws, meta = [], []
    for t in ts:
        flip = t.dim() == 2 and not t.is_contiguous() and t.t().is_contiguous()
        if flip:
            t = t.t()
        # flat bytes: one dtype (gloo's coalesced gather garbles mixed ones), and a (n, 1) tensor's
        # stride of n in its last dim cannot be viewed as bytes
        raws.append(t.contiguous().reshape(-1).view(torch.uint8))
        meta.append((1 - dim if flip else dim, flip, t.dtype, t.shape[0], world))
    outs = torch.ops._c10d_functional.all_gather_into_tensor_coalesced(raws, world, group)
    return [(out, *m) for out, m in zip(outs, meta)]


def _sp_gather_wait(pending) -> torch.Tensor:
    out, dim, flip, dtype, rows, world = pending
    out = torch.ops._c10d_functional.wait_tensor(out).view(rows * world, -1)  # the ranks' rows, stacked
    if dim == 1:
        out = torch.cat(out.chunk(world, 0), dim=1)
    out = out.view(dtype)
    return out.t() if flip else out


def _sp_reduce_scatter_start(t: torch.Tensor, group: str, world: int) -> torch.Tensor:
    """Starts this rank's sequence shard of the sum of every rank's t (dgrad of the all-gather);
    wait_tensor on the result finishes it."""
    return torch.ops._c10d_functional.reduce_scatter_tensor(t.contiguous(), "sum", world, group)


class Fp8SwiGLUOutput(NamedTuple):
    """FC1's output where SwiGLU is its epilogue and FC2 takes y in FP8 (traced_linear(fp8_out=True)):
    y's FP8 operands for FC2 (along F, and y^T along the tokens for FC2's wgrad), and `anchor`, a
    tensor of y's shape and dtype, never written, that carries y's gradient from FC2 back to FC1 for
    autograd. megatron's MLP hands it from FC1 to FC2 untouched (its activation is then the identity)."""

    anchor: torch.Tensor
    q: torch.Tensor
    scale: torch.Tensor
    qt: torch.Tensor
    scale_t: torch.Tensor
    granularity: str


def _forward(ctx, x, weight, w, w_scale, w_mm, w_mm_t, bias, x_ops, w_gran, act_gran, grad_gran, scale_format, fmt,
             sp_group, sp_size, to_main_grad, swiglu):
    """The shared forward of the traced Functions: FC's output before any epilogue, and the tensors
    to save (a dict the caller may extend, then gives to _save). x_ops: x's operands already
    quantized ((q, s, gran), (qt, st, gran)), x then being only y's anchor (Fp8SwiGLUOutput)."""
    need_wgrad = ctx.needs_input_grad[1]
    if x_ops is None:
        (qx, sx, gx), xt = quantize_pair(x, act_gran, scale_format, fmt, cols=need_wgrad)
    else:
        (qx, sx, gx), xt = x_ops
    if sp_group is not None:  # X^T's shards stay local until backward
        qx, sx = [_sp_gather_wait(p) for p in _sp_gather_start((qx, sx), 0, sp_group, sp_size)]
    y = fp8_mm(qx, sx, gx, w, w_scale, w_gran, x.dtype, False, w_mm)
    if bias is not None:
        y = y + bias.to(y.dtype)
    ctx.swiglu = swiglu
    saved = {"w": w, "w_scale": w_scale, "w_mm_t": w_mm_t}
    ctx.to_main_grad = to_main_grad and need_wgrad
    if ctx.to_main_grad:
        saved["weight"] = weight
    if need_wgrad and xt is not None:
        saved["xt"], saved["xt_scale"] = xt[0], xt[1]
        ctx.xt_gran = xt[2]
    ctx.w_gran, ctx.grad_gran, ctx.scale_format, ctx.fmt = w_gran, grad_gran, scale_format, fmt
    ctx.x_dtype, ctx.w_dtype, ctx.has_bias = x.dtype, weight.dtype, bias is not None
    ctx.sp_group, ctx.sp_size = sp_group, sp_size
    return y, saved


def _save(ctx, saved: dict) -> None:
    saved = {k: t for k, t in saved.items() if t is not None}
    ctx.saved_names = tuple(saved)
    ctx.save_for_backward(*saved.values())


def _backward(ctx, dy):
    """dX, dW (or main_grad's placeholder) and d(bias) of the traced Functions."""
    need_dgrad, need_wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    saved = dict(zip(ctx.saved_names, ctx.saved_tensors))
    sp = ctx.sp_group is not None
    # Under SP, megatron's order: X^T's shards (saved unreduced: half the memory at TP=2) are gathered
    # around dY's quantization and dgrad, and dX's reduce-scatter around wgrad. On two H200s
    # (torch 2.11, NCCL) the profile still saw no collective beside a compute kernel.
    if sp and need_wgrad:
        pending = _sp_gather_start((saved["xt"], saved["xt_scale"]), 1, ctx.sp_group, ctx.sp_size)
    (qdy, sdy, gdy), dyt = _grad_operands(ctx, saved, dy, need_wgrad)
    dx = None
    if need_dgrad:
        dx = fp8_mm(qdy, sdy, gdy, saved["w"], saved["w_scale"], ctx.w_gran, ctx.x_dtype, True, saved.get("w_mm_t"))
        if sp:
            dx = _sp_reduce_scatter_start(dx, ctx.sp_group, ctx.sp_size)
    dw = None
    if need_wgrad:
        xt = [_sp_gather_wait(p) for p in pending] if sp else [saved["xt"], saved["xt_scale"]]
        if ctx.to_main_grad:
            dw = fp8_wgrad_main_grad(dyt[0], dyt[1], dyt[2], xt[0], xt[1], ctx.xt_gran, saved["weight"])
        else:  # dW in the weight's dtype, for autograd
            dw = fp8_mm(dyt[0], dyt[1], dyt[2], xt[0], xt[1], ctx.xt_gran, ctx.w_dtype)
    if dx is not None and sp:
        dx = torch.ops._c10d_functional.wait_tensor(dx)
    db = dy.float().sum(0) if ctx.has_bias and ctx.needs_input_grad[6] else None
    return dx, dw, db


class TracedFp8Linear(torch.autograd.Function):
    """Y = X W^T with fprop, dgrad and wgrad in FP8, as Fp8LinearFunction, for torch.compile.

    Inputs: x [M, K] (activation dtype), weight [N, K] (only for its gradient's dtype and shape),
    w / w_scale (W quantized along K), w_mm / w_mm_t (W's and W^T's scales in scaled_mm's layout, or
    None), bias or None; x's operands already quantized (FC2 after FC1's FP8 output, x then being its
    anchor: q, scale, q^T, scale^T, granularity) or five Nones; then the recipe's fields as plain
    values (dynamo specialises on them), then the sequence-parallel group's name and size, or None
    and 1: with a group, x is this rank's shard of the sequence and Y covers the whole sequence
    (per-token activations only: their quantization groups never straddle two shards when each holds
    a multiple of 128 tokens). Last, to_main_grad and the SwiGLU epilogue's (scale_format, fmt), or
    None and None (see traced_linear).
    """

    @staticmethod
    def forward(ctx, x, weight, w, w_scale, w_mm, w_mm_t, bias, xq, xs, xqt, xst, x_gran, w_gran: str, act_gran: str,
                grad_gran: str, scale_format: str, fmt: str, sp_group: str | None, sp_size: int, to_main_grad: bool,
                swiglu_sf: str | None, swiglu_fmt: str | None):
        x_ops = None if xq is None else ((xq, xs, x_gran), None if xqt is None else (xqt, xst, x_gran))
        swiglu = None if swiglu_sf is None else (swiglu_sf, swiglu_fmt)
        y, saved = _forward(ctx, x, weight, w, w_scale, w_mm, w_mm_t, bias, x_ops, w_gran, act_gran, grad_gran,
                            scale_format, fmt, sp_group, sp_size, to_main_grad, swiglu)
        if swiglu is not None:  # the SwiGLU epilogue: y = swiglu(h), h kept in FP8 (swiglu.py)
            y, saved["qh"], saved["sh"] = swiglu_fp8_forward(y, *swiglu)
        _save(ctx, saved)
        return y

    @staticmethod
    def backward(ctx, dy):
        dx, dw, db = _backward(ctx, dy)
        return (dx, dw, None, None, None, None, db) + (None,) * 15


class TracedFp8SwiGLUToFp8(torch.autograd.Function):
    """TracedFp8Linear with the SwiGLU epilogue whose output goes on in FP8: y = swiglu(X W^T) is
    quantized for the next FP8 linear (FC2) as it is computed, in the recipe's activation formats,
    and never written in the activation dtype (one kernel with h's FP8 copy, where it applies).
    Returns y's anchor, then y's operands along F and y^T's along the tokens (Fp8SwiGLUOutput's order);
    the backward takes dY through the anchor. Inputs: TracedFp8Linear's, without the pre-quantized ones."""

    @staticmethod
    def forward(ctx, x, weight, w, w_scale, w_mm, w_mm_t, bias, w_gran: str, act_gran: str, grad_gran: str,
                scale_format: str, fmt: str, sp_group: str | None, sp_size: int, to_main_grad: bool, swiglu_sf: str,
                swiglu_fmt: str):
        swiglu = (swiglu_sf, swiglu_fmt)
        h, saved = _forward(ctx, x, weight, w, w_scale, w_mm, w_mm_t, bias, None, w_gran, act_gran, grad_gran,
                            scale_format, fmt, sp_group, sp_size, to_main_grad, swiglu)
        saved["qh"], saved["sh"], (q, s, _), (qt, st, _) = _swiglu_operands(h, swiglu, act_gran, scale_format, fmt)
        _save(ctx, saved)
        ctx.mark_non_differentiable(q, s, qt, st)
        # y's gradient arrives here through the anchor; FC2 never reads it, so it is never written
        return h.new_empty((h.shape[0], h.shape[1] // 2)), q, s, qt, st

    @staticmethod
    def backward(ctx, dy, *_):
        dx, dw, db = _backward(ctx, dy)
        return (dx, dw, None, None, None, None, db) + (None,) * 10


def _swiglu_operands(h, swiglu, act_gran: str, scale_format: str, fmt: str):
    """h's FP8 copy (data, scales) for SwiGLU's backward, and y = swiglu(h)'s operands along F and
    along the tokens in the activation granularity: one kernel for per-token activations where it
    applies, else SwiGLU's forward, then the quantizer."""
    if act_gran == "token" and fused_forward_quantize_ok(h):
        qh, sh, q, s, qt, st = swiglu_fp8_forward_quantized(h, *swiglu, scale_format, fmt)
        return qh, sh, (q, s, "token"), (qt, st, "token")
    y, qh, sh = swiglu_fp8_forward(h, *swiglu)
    yq, yt = quantize_pair(y, act_gran, scale_format, fmt, cols=True)
    return qh, sh, yq, yt


def _grad_operands(ctx, saved: dict, dy: torch.Tensor, cols: bool):
    """The GEMM operands of the output gradient: dY quantized along N, and dY^T along the tokens
    when `cols`. With the SwiGLU epilogue, dy is the gradient of swiglu(h), and the operands are
    those of dh: one fused kernel (no bf16 dh in memory) where it applies, else dh, then quantized."""
    if ctx.swiglu is None:
        return quantize_pair(dy, ctx.grad_gran, ctx.scale_format, ctx.fmt, cols)
    qh, sh = saved["qh"], saved["sh"]
    if ctx.grad_gran == "token" and cols and fused_backward_quantize_ok(qh, dy, ctx.x_dtype):
        q, s, qt, st = swiglu_fp8_backward_quantized(qh, sh, dy, ctx.scale_format, ctx.fmt)
        return (q, s, "token"), (qt, st, "token")
    dh = swiglu_fp8_backward(qh, sh, dy, ctx.x_dtype, *ctx.swiglu)
    return quantize_pair(dh, ctx.grad_gran, ctx.scale_format, ctx.fmt, cols)


def traced_linear(x, weight: torch.Tensor, wq: QTensor, bias: torch.Tensor | None, recipe,
                  sp_group: str | None = None, sp_size: int = 1, to_main_grad: bool = False,
                  swiglu: tuple[str, str] | None = None, fp8_out: bool = False):
    """x [..., K] @ weight^T under an FP8 recipe, from the weight's cached FP8 operand (wq:
    WeightCache.get(weight, recipe), made outside the compiled region).

    sp_group / sp_size: the name and size of a sequence-parallel group; x is then this rank's shard
    of the sequence (dim 0) and the result covers every rank's shard, as megatron's all-gather would.
    to_main_grad: the weight has megatron's FP32 `main_grad` and its grad hook skips what autograd
    gets (grad_added_to_main_grad): the wgrad GEMM adds into main_grad itself (fp8_wgrad_main_grad).
    swiglu: (scale_format, fmt) of SwiGLU's saved input: the result is swiglu(x @ weight^T) (megatron's
    gated FC1 output [gate, up]), with h saved in FP8 as swiglu.swiglu_fp8_input saves it, and the
    backward turns dY into FC1's FP8 gradient operands directly (_grad_operands). Not with a bias.
    fp8_out (with swiglu): return swiglu's output as FC2's FP8 operands (an Fp8SwiGLUOutput), never
    written in the activation dtype; x may be such an output, which this linear then takes as is
    (the recipe's activation granularity, no sequence parallelism: FC2 is row-parallel).
    """
    if sp_group is not None and recipe.activation != "token":
        raise ValueError(f"the traced sequence-parallel FP8 gather takes per-token activations, not {recipe.activation!r}")
    if swiglu is not None and bias is not None:
        raise ValueError("the FP8 linear's SwiGLU epilogue takes no bias (its backward never forms dh for the bias "
                         "gradient); apply swiglu.swiglu_fp8_input after the linear instead")
    if fp8_out and swiglu is None:
        raise ValueError("fp8_out is the SwiGLU epilogue's FP8 output: give swiglu=(scale_format, fmt) too")
    # the scaled_mm scale layouts the weight cache made for a block weight; None for per-tensor weights
    w_mm, w_mm_t = wq.layout_cache.get("scaled_mm"), wq.layout_cache.get("scaled_mm_t")
    fields = (wq.granularity, recipe.activation, recipe.grad, recipe.scale_format, recipe.fmt, sp_group, sp_size,
              to_main_grad)
    if isinstance(x, Fp8SwiGLUOutput):
        if sp_group is not None or swiglu is not None:
            raise ValueError("an FP8 SwiGLU output goes into a row-parallel linear (FC2), without sequence-parallel "
                             "gather or an epilogue of its own")
        pre, x = (x.q, x.scale, x.qt, x.scale_t, x.granularity), x.anchor
    else:
        pre = (None,) * 5
    k = x.shape[-1]
    lead = (x.shape[0] * sp_size, *x.shape[1:-1])
    if fp8_out:
        anchor, q, s, qt, st = TracedFp8SwiGLUToFp8.apply(x.reshape(-1, k), weight, wq.data, wq.scale, w_mm, w_mm_t,
                                                          bias, *fields, *swiglu)
        return Fp8SwiGLUOutput(anchor.reshape(*lead, anchor.shape[-1]), q, s, qt, st, _operand_gran(recipe.activation))
    y = TracedFp8Linear.apply(x.reshape(-1, k), weight, wq.data, wq.scale, w_mm, w_mm_t, bias, *pre, *fields,
                              *(swiglu or (None, None)))
    return y.reshape(*lead, y.shape[-1])
