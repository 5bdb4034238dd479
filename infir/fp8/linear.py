"""FP8 linear layer: Y = X W^T with fprop, dgrad and wgrad all as FP8 GEMMs.

Each operand is quantized along the dimension its GEMM contracts (recipe.py says how):
    fprop  Y  = X  W^T      X  along K      W   per recipe.weight
    dgrad  dX = dY W        dY along N      W^T = the *same* blocks as W (QTensor.t())
    wgrad  dW = dY^T X      dY^T, X^T along the tokens
X is quantized in fprop into both layouts by one launch and only X^T is kept for backward, in
FP8 (half the bytes of saving X in bf16); dY likewise in backward. The weight is quantized once per optimizer step by a WeightCache and reused
by every micro-batch and by dgrad. Where the weight has a float32 `main_grad` (megatron's
gradient-accumulation buffer) the wgrad GEMM adds into it (FP32 accumulation; in place, through
cuBLASLt, on Hopper) and autograd gets no dW; otherwise dW comes back in the weight's dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .autoscale import AutoScaler
from .formats import amax_with_nan_as_inf, get_format
from .gemm import fp8_gemm, fp8_gemm_accumulate, scaled_mm_scale
from .quantize import QTensor, fold_two_level, quantize_reference, quantize_tensor_ref, transposed
from .recipe import Recipe, get_recipe


def quantize_operand(x2: torch.Tensor, granularity: str, recipe: Recipe, rows: bool = True, cols: bool = False):
    """x2 [M, K] -> (x2 quantized along K as [M, K], x2^T quantized along M as [K, M]); either may be None.

    Two-level operands come back folded (quantize.fold_two_level): the form Hopper's GEMM takes.
    """
    sf, fmt = recipe.scale_format, recipe.fmt
    if x2.is_cuda:
        from . import kernels as kn

        if x2.stride(-1) != 1:  # the kernels index rows by stride and walk K contiguously
            x2 = x2.contiguous()
        if granularity == "token":
            return kn.quantize_token_triton(x2, sf, fmt, rows=rows, cols=cols)
        if granularity == "tensor":
            q, qt = kn.quantize_tensor_triton(x2, sf, fmt, transpose=cols)
            return (q if rows else None), qt
        q = kn.quantize_two_level_triton(x2, sf, fmt, fold=True) if rows else None
        qt = kn.quantize_two_level_triton(transposed(x2), sf, fmt, fold=True) if cols else None
        return q, qt
    quant = lambda t: quantize_reference(t, granularity, sf, fmt)
    if granularity == "two_level":
        quant = lambda t: fold_two_level(quantize_reference(t, granularity, sf, fmt))
    q = quant(x2) if rows else None
    if not cols:
        return q, None
    qt = q.t() if (granularity == "tensor" and q is not None) else quant(x2.t())
    return q, qt


class WeightCache:
    """The FP8 copy of one weight, made once per optimizer step.

    dgrad reads the same FP8 values transposed (QTensor.t(): a 128x128 block of W is one of W^T),
    made in backward and freed after its GEMM, so no second FP8 copy of the weight is kept.

    Stale copies are detected by the weight's storage and in-place version counter, so a trainer
    that forgets to call step() still gets fresh weights; step(lr) after optimizer.step() is what
    advances MOSS automatic scaling (the predicted bound grows by the learning rate).
    """

    def __init__(self, name: str = ""):
        self.name = name
        self.autoscaler: AutoScaler | None = None
        self._key = None
        self.q: QTensor | None = None

    def invalidate(self) -> None:
        self._key = None

    def step(self, lr: float) -> None:
        if self.autoscaler is not None:
            self.autoscaler.step(lr)
        self.invalidate()

    @staticmethod
    def key(weight: torch.Tensor, recipe: Recipe) -> tuple:
        return (weight.data_ptr(), weight._version, weight.dtype, recipe)

    def fresh(self, weight: torch.Tensor, recipe: Recipe) -> bool:
        """Whether the cached copy is of this weight as it is now."""
        return self._key == self.key(weight, recipe)

    def get(self, weight: torch.Tensor, recipe: Recipe) -> QTensor:
        if not self.fresh(weight, recipe):
            self.q = _refill(self.q, self._quantized(weight, recipe))
            self._key = self.key(weight, recipe)
        return self.q

    def refill(self, weight: torch.Tensor, recipe: Recipe) -> None:
        """Quantize `weight` into the tensors the cache already holds, allocating none that outlives
        the call: the step a CUDA graph of every layer's refresh records (WeightRefresh). The cache
        is marked fresh by mark_fresh once the graph has run."""
        if self.q is None or _refill(self.q, self._quantized(weight, recipe)) is not self.q:
            raise RuntimeError("WeightCache.refill needs a cached copy of the same shapes and formats "
                               "(fill it with get() first)")

    def mark_fresh(self, weight: torch.Tensor, recipe: Recipe) -> None:
        self._key = self.key(weight, recipe)

    def _quantized(self, weight: torch.Tensor, recipe: Recipe) -> QTensor:
        q = self._quantize(weight.detach(), recipe)
        if q.granularity == "block":
            # fprop's and dgrad's scale layouts, made here (eager, once a step) so that a
            # compiled layer gets them as inputs instead of rebuilding them every micro-batch
            # (on any device: the compiled graph then has one structure wherever it is traced)
            scaled_mm_scale(q)
            scaled_mm_scale(q, transposed=True)
        return q

    def _quantize(self, w: torch.Tensor, recipe: Recipe) -> QTensor:
        sf, fmt = recipe.scale_format, recipe.fmt
        if recipe.weight == "block":
            if w.is_cuda:
                from .kernels import quantize_block_triton

                return quantize_block_triton(w, sf, fmt)
            return quantize_reference(w, "block", sf, fmt)
        scale = None
        if recipe.autoscale_weights:
            if self.autoscaler is None:
                self.autoscaler = AutoScaler(fmt, recipe.resync_interval, self.name)
            scale = self.autoscaler.scale(w)
        if w.is_cuda:
            from .kernels import quantize_tensor_triton

            seen = torch.zeros((), dtype=torch.float32, device=w.device) if self.autoscaler else None
            q, _ = quantize_tensor_triton(w, sf, fmt, scale=scale, record_amax=seen)
        else:
            q = quantize_tensor_ref(w, get_format(fmt), sf, scale=scale)
            seen = amax_with_nan_as_inf(w) if self.autoscaler else None
        if self.autoscaler is not None:
            self.autoscaler.observe(seen)
        return q


def _tensors(q: QTensor) -> list:
    return [q.data, q.scale, q.global_scale, q.local_exp, *q.layout_cache.values()]


def _refill(old: QTensor | None, new: QTensor) -> QTensor:
    """`new`'s values in `old`'s tensors where every one matches in shape, dtype and strides: the
    FP8 weight keeps its addresses from step to step, so CUDA graphs replaying a layer read the
    fresh weight instead of re-recording (or copying it in) on every step."""
    if old is None or old.granularity != new.granularity or old.layout_cache.keys() != new.layout_cache.keys():
        return new
    pairs = list(zip(_tensors(old), _tensors(new)))
    if any((a is None) != (b is None) or (a is not None and (a.shape, a.dtype, a.stride()) != (b.shape, b.dtype, b.stride()))
           for a, b in pairs):
        return new
    with torch.no_grad():
        for a, b in pairs:
            if a is not None:
                a.copy_(b)
    return old


class Fp8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, recipe: Recipe, cache: WeightCache, backend: str):
        need_dgrad, need_wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        k = x.shape[-1]
        x2 = x.reshape(-1, k)
        qx, qxt = quantize_operand(x2, recipe.activation, recipe, rows=True, cols=need_wgrad)
        qw = cache.get(weight, recipe)
        y = fp8_gemm(qx, qw, out_dtype=x.dtype, backend=backend)
        if bias is not None:
            y = y + bias.to(y.dtype)
        ctx.recipe, ctx.backend = recipe, backend
        ctx.qw = qw if need_dgrad else None
        ctx.qxt = qxt
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.has_bias = bias is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.save_for_backward(weight)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        dx2, dw, db = fp8_backward(ctx, dy)
        dx = dx2.reshape(ctx.x_shape) if dx2 is not None else None
        return dx, dw, db, None, None, None


def fp8_backward(ctx, dy: torch.Tensor):
    """dgrad and wgrad of an FP8 linear from its autograd ctx: (dX as [M, K] or None, dW or None, db or None).

    ctx holds: recipe, qw (W as quantized for the forward), backend, qxt (X^T quantized along the tokens), x_dtype,
    has_bias, bias_dtype, needs_input_grad and the saved weight. Shared by Fp8LinearFunction and by
    layers that wrap communication around the same GEMMs (the sequence-parallel column linear).
    """
    (weight,) = ctx.saved_tensors
    recipe = ctx.recipe
    need_dgrad, need_wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    dy2 = dy.reshape(-1, dy.shape[-1])
    qdy, qdyt = quantize_operand(dy2, recipe.grad, recipe, rows=need_dgrad, cols=need_wgrad)
    dx = dw = db = None
    if need_dgrad:
        dx = fp8_gemm(qdy, ctx.qw.t(), out_dtype=ctx.x_dtype, backend=ctx.backend)
    if need_wgrad:
        # With main_grad (FP32) the product is added into it; a weight without one gets dW in its
        # own dtype (autograd accumulates a bf16 weight's grad in bf16 anyway; the GEMM accumulates
        # in FP32 inside either way)
        main_grad = getattr(weight, "main_grad", None)
        if main_grad is not None:  # added in place where the GEMM can (gemm.fp8_gemm_accumulate)
            fp8_gemm_accumulate(qdyt, ctx.qxt, main_grad, backend=ctx.backend)
        else:
            dw = fp8_gemm(qdyt, ctx.qxt, out_dtype=weight.dtype, backend=ctx.backend)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        db = dy2.float().sum(0).to(ctx.bias_dtype)
    ctx.qxt = ctx.qw = None
    return dx, dw, db


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           recipe: str | Recipe = "fp8_blockwise_ue8m0", weight_cache: WeightCache | None = None,
           backend: str = "auto") -> torch.Tensor:
    """F.linear under a precision recipe: x [..., K], weight [N, K] (bf16 or fp32 master) -> [..., N] in x.dtype.

    weight_cache: keep one per layer to quantize the weight once per optimizer step (without one
    the weight is quantized on every call). backend: see gemm.py ("auto" picks per device).
    """
    recipe = get_recipe(recipe)
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(f"linear: x has K={x.shape[-1]} but weight is {tuple(weight.shape)} ([N, K])")
    if not recipe.fp8:
        return F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
    cache = weight_cache if weight_cache is not None else WeightCache()
    return Fp8LinearFunction.apply(x, weight, bias, recipe, cache, backend)


class Fp8Linear(torch.nn.Module):
    """nn.Linear under a recipe, with its own WeightCache (call .weight_cache.step(lr) after each optimizer step)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, recipe: str | Recipe = "fp8_blockwise_ue8m0",
                 backend: str = "auto", device=None, dtype=None):
        super().__init__()
        ref = torch.nn.Linear(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.weight, self.bias = ref.weight, ref.bias
        self.recipe = get_recipe(recipe)
        self.backend = backend
        self.weight_cache = WeightCache()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.recipe, self.weight_cache, self.backend)
