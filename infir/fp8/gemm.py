"""One FP8 GEMM entry point, C = A @ B^T for QTensors A [M, K] and B [N, K] (K last in both).

Every FP8 product of the linear layer has this "NT" form (fprop X W^T, dgrad dY (W^T)^T, wgrad
dY^T (X^T)^T), which is the only layout Hopper's FP8 tensor cores take. Backends:
- "scaled_mm": torch.nn.functional.scaled_mm (cuBLAS/CUTLASS), sm90. Pairs: (token, block) and
  (token, token) as BlockWise1x128 x BlockWise128x128 / BlockWise1x128, and (tensor, tensor).
  (token, token) is the wgrad product; where kernels/lt_wgrad.cu builds, it goes to cuBLASLt
  directly instead: the same bits, the fastest of cuBLASLt's algorithms for the shape rather than
  the heuristic's first, and accumulation into an FP32 buffer in place (fp8_gemm_accumulate).
  Layout rules (checked on an H100 with torch 2.11): 1x128 scales outer-dim-major (M, K/128)
  with stride (1, M); 128x128 scales passed as the transpose of (N/128, K/128) with the K-block
  count padded to a multiple of 4.
  (row, tensor) and (row, row) as RowWise: the MOSS operands after fold_two_level().
- "triton": the exact MOSS two-level GEMM in kernels/gemm_two_level.py (per-32 scales applied to
  the FP32 accumulator in the main loop; slower, kept as the exact twin of the fold).
- "emulated": dequantize both operands and matmul in float32, any device (gemm_reference.py: the
  reference of every other backend).
- "auto": scaled_mm or triton on an sm90 GPU where the shapes fit, emulated elsewhere.
"""
from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F

from .gemm_reference import emulated_gemm
from .quantize import QTensor

BACKENDS = ("auto", "scaled_mm", "triton", "emulated")
_SCALED_MM_PAIRS = {("token", "block"), ("token", "token"), ("tensor", "tensor"), ("row", "tensor"), ("row", "row")}
# cuBLAS row-wise scaling may only write bf16; found out on first use (None = not tried yet)
_ROWWISE_FP32_OUT: bool | None = None


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def is_sm90(t: torch.Tensor) -> bool:
    return t.is_cuda and _capability(t.device.index if t.device.index is not None else torch.cuda.current_device()) == (9, 0)


def blockwise_dtypes_ok(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether scaled_mm's blockwise (1x128, 128x128) scaling takes these FP8 dtypes: E4M3 only on
    Hopper (torch 2.11 refuses an E5M2 operand), where the recipes with E5M2 gradients fall back."""
    return a.dtype == b.dtype == torch.float8_e4m3fn


def scaled_mm_misfits(a: QTensor, b: QTensor) -> list[str]:
    """What keeps A [M, K] @ B [N, K]^T off the scaled_mm backend (its granularities, dtypes, or each size that
    is not the multiple it needs, named so); empty where scaled_mm takes it."""
    if (a.granularity, b.granularity) not in _SCALED_MM_PAIRS:
        return [f"granularities {(a.granularity, b.granularity)}"]
    if a.data.dim() != 2 or b.data.dim() != 2:
        return [f"operands of {a.data.dim()} and {b.data.dim()} dimensions"]
    if a.granularity == "token" and not blockwise_dtypes_ok(a.data, b.data):
        return [f"dtypes {(a.data.dtype, b.data.dtype)}"]
    (m, k), n = a.data.shape, b.data.shape[0]
    need = ((("K", k, 16), ("N", n, 16)) if a.granularity in ("tensor", "row")
            else (("K", k, 128), ("N", n, 128), ("M", m, 16)))
    return [f"{name}={size} (needs a multiple of {multiple})" for name, size, multiple in need if size % multiple]


def scaled_mm_fits(a: QTensor, b: QTensor) -> bool:
    """Shapes, granularities and dtypes the scaled_mm backend takes (else auto falls back)."""
    return not scaled_mm_misfits(a, b)


def outer_dim_major(s: torch.Tensor) -> torch.Tensor:
    """(rows, blocks) scales with strides exactly (1, rows), as scaled_mm checks them; the Triton kernels
    already write them so. Rows sliced from such a scale keep the whole's column stride, and a single
    column's stride is arbitrary: the first needs a copy, the second only its stride restated."""
    rows = s.shape[0]
    if s.stride() == (1, rows):
        return s
    if s.stride(0) == 1 and s.shape[1] == 1:
        return s.as_strided(s.shape, (1, rows))
    return torch.empty_strided(s.shape, (1, rows), dtype=s.dtype, device=s.device).copy_(s)


def _pad_cols(s: torch.Tensor, multiple: int) -> torch.Tensor:
    pad = (-s.shape[1]) % multiple
    return s if pad == 0 else torch.cat([s, s.new_ones(s.shape[0], pad)], dim=1)


def scaled_mm_scale(q: QTensor, transposed: bool = False) -> torch.Tensor:
    """q's scale (or, for a 'block' or 'tensor' q, that of q.t()) in the layout scaled_mm takes for
    its B operand, made once per QTensor: a weight's serves every micro-batch of an optimizer step."""
    key = "scaled_mm_t" if transposed else "scaled_mm"
    s = q.layout_cache.get(key)
    if s is None:
        if q.granularity == "tensor":
            s = q.scale.reshape(1)
        elif q.granularity == "block":
            s = _pad_cols(q.scale.t().contiguous() if transposed else q.scale, 4).t()
        elif transposed:
            raise ValueError(f"scaled_mm_scale: a {q.granularity!r} operand has no transposed scale layout")
        else:
            s = outer_dim_major(q.scale)
        q.layout_cache[key] = s
    return s


def block_layout_copies(q: QTensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(destination, source) pairs that bring the scaled_mm layouts q.layout_cache holds of a block q's
    scale up to date after the scale's values change in place: destination.copy_(source) for each (none
    for a layout that is a view of the scale itself). scaled_mm_scale's block layouts are the scale, or its
    transpose, in the first rows of a column-padded tensor seen transposed."""
    pairs = []
    for key, layout in q.layout_cache.items():
        if layout.untyped_storage().data_ptr() == q.scale.untyped_storage().data_ptr():
            continue
        source = q.scale if key == "scaled_mm_t" else q.scale.t()
        pairs.append((layout[:source.shape[0]], source))
    return pairs


if hasattr(F, "scaled_mm"):
    _BLOCKWISE = {"token": F.ScalingType.BlockWise1x128, "block": F.ScalingType.BlockWise128x128}
    _NO_SWIZZLE = F.SwizzleType.NO_SWIZZLE
    # F.scaled_mm wraps every argument in a list and turns its enums into ints on each call, then calls
    # torch._scaled_mm_v2. The compiled FP8 layer makes ~12 such calls per layer and micro-batch, and
    # its step is partly host-bound, so the blockwise path builds those lists once and calls the op itself.
    _MM_V2 = getattr(torch, "_scaled_mm_v2", None)
    _RECIPE_INTS = {g: [e.value] for g, e in _BLOCKWISE.items()}
    _SWIZZLE_INTS = [_NO_SWIZZLE.value]
else:
    _MM_V2 = None


_LT_WGRAD = None  # kernels.lt_wgrad.lt_wgrad, imported on first use (it builds CUDA code)


def _lt_wgrad():
    global _LT_WGRAD
    if _LT_WGRAD is None:
        from .kernels.lt_wgrad import lt_wgrad

        _LT_WGRAD = lt_wgrad
    return _LT_WGRAD


def scaled_mm_blockwise(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, b_gran: str,
                        out_dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B^T for 1x128-scaled A [M, K] (scales outer-dim-major) and B [N, K] with 'token' or
    'block' scales already in scaled_mm's layout (scaled_mm_scale): the per-call fast path of the
    compiled FP8 linear, with no checks or layout work left to do. (token, token) tries cuBLASLt first.
    `out`: a contiguous [M, N] tensor C is written into (rows of a larger product), returned."""
    if b_gran == "token":
        c = _lt_wgrad()(a, a_scale, b, b_scale, out_dtype)
        if c is not None:
            return c if out is None else out.copy_(c)
    if _MM_V2 is not None:  # F.scaled_mm's own call, without its per-call argument building
        args = (a, b.t(), [a_scale], _RECIPE_INTS["token"], _SWIZZLE_INTS, [b_scale], _RECIPE_INTS[b_gran],
                _SWIZZLE_INTS, None, out_dtype, (), False)
        return _MM_V2(*args) if out is None else torch.ops.aten._scaled_mm_v2.out(*args, out=out)
    if hasattr(F, "scaled_mm"):
        c = F.scaled_mm(a, b.t(), a_scale, _BLOCKWISE["token"], b_scale, _BLOCKWISE[b_gran],
                        swizzle_a=_NO_SWIZZLE, swizzle_b=_NO_SWIZZLE, output_dtype=out_dtype)
    else:
        c = torch._scaled_mm(a, b.t(), a_scale, b_scale, out_dtype=out_dtype)
    return c if out is None else out.copy_(c)


def scaled_mm_blockwise_accumulate(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                                   out: torch.Tensor) -> None:
    """out (FP32) += A @ B^T for 1x128-scaled A and B (the wgrad product), in place through cuBLASLt
    where it applies, else as scaled_mm's FP32 product added to out (the same bits). A's rows may be
    strided (columns of a wider matrix): cuBLASLt reads them in place, scaled_mm from a copy."""
    if _lt_wgrad()(a, a_scale, b, b_scale, accumulate=out) is None:
        out.add_(scaled_mm_blockwise(a.contiguous(), a_scale, b, b_scale, "token", torch.float32))


def scaled_mm_gemm(a: QTensor, b: QTensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    if not scaled_mm_fits(a, b):
        raise ValueError(
            f"scaled_mm backend cannot take ({a.granularity}, {b.granularity}) operands of shapes "
            f"{tuple(a.data.shape)} x {tuple(b.data.shape)}: it needs (token, block|token) with M a multiple of 16 "
            "and K, N multiples of 128, or (tensor|row, tensor|row) with K, N multiples of 16; "
            "use backend='emulated' or 'auto'"
        )
    if a.granularity == "row":
        return _rowwise_gemm(a, b, out_dtype)
    sb = scaled_mm_scale(b)
    if a.granularity != "tensor":
        return scaled_mm_blockwise(a.data, outer_dim_major(a.scale), b.data, sb, b.granularity, out_dtype)
    sa = a.scale.reshape(1)
    mat_b = b.data.t()  # [K, N] column-major: the bytes of b as stored
    if hasattr(F, "scaled_mm"):
        tw = F.ScalingType.TensorWise
        return F.scaled_mm(a.data, mat_b, sa, tw, sb, tw, swizzle_a=_NO_SWIZZLE, swizzle_b=_NO_SWIZZLE,
                           output_dtype=out_dtype)
    # torch < 2.10: the private op infers the recipe from the scale shapes
    return torch._scaled_mm(a.data, mat_b, sa, sb, out_dtype=out_dtype)


def _rowwise_gemm(a: QTensor, b: QTensor, out_dtype: torch.dtype) -> torch.Tensor:
    global _ROWWISE_FP32_OUT
    n = b.data.shape[0]
    sa = a.scale.reshape(-1, 1).contiguous()
    sb = b.scale.reshape(1, -1).expand(1, n).contiguous()
    if hasattr(F, "scaled_mm"):
        rw = F.ScalingType.RowWise
        sw = F.SwizzleType.NO_SWIZZLE
        call = lambda dt: F.scaled_mm(a.data, b.data.t(), sa, rw, sb, rw, swizzle_a=sw, swizzle_b=sw, output_dtype=dt)
    else:
        call = lambda dt: torch._scaled_mm(a.data, b.data.t(), sa, sb, out_dtype=dt)
    if out_dtype != torch.float32 or _ROWWISE_FP32_OUT:
        return call(out_dtype)
    if _ROWWISE_FP32_OUT is None:
        try:
            out = call(torch.float32)
            _ROWWISE_FP32_OUT = True
            return out
        except RuntimeError:
            _ROWWISE_FP32_OUT = False
    return call(torch.bfloat16).float()


def resolve_backend(a: QTensor, b: QTensor, backend: str = "auto") -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown GEMM backend {backend!r}; use one of {list(BACKENDS)}")
    if backend != "auto":
        return backend
    if is_sm90(a.data):
        if a.granularity == "two_level":
            return "triton"  # exact two-level; the fast MOSS path folds first (granularity "row")
        if scaled_mm_fits(a, b):
            return "scaled_mm"
        _warn_slow_fallback(a, b)
    return "emulated"


@functools.lru_cache(maxsize=64)
def _warn_slow_fallback_once(pair: tuple, why: str) -> None:
    warnings.warn(f"fp8_gemm: {pair} operands run the emulated FP32 GEMM on the GPU, which is far slower; {why}",
                  stacklevel=3)


def _warn_slow_fallback(a: QTensor, b: QTensor) -> None:
    if a.granularity == "token" and not blockwise_dtypes_ok(a.data, b.data):
        why = (f"blockwise scaled_mm takes E4M3 operands only, not {(str(a.data.dtype), str(b.data.dtype))} (so an "
               "E5M2 recipe's dgrad and wgrad run this way on Hopper): use an E4M3 recipe for speed")
    else:
        why = (f"A {tuple(a.data.shape)} @ B {tuple(b.data.shape)}^T does not fit scaled_mm: "
               f"{', '.join(scaled_mm_misfits(a, b))}. In a layer M, N and K are the micro-batch's tokens and the "
               "layer's widths on one tensor-parallel rank (hidden, FFN, heads x head dim, over TP): choose a "
               "micro-batch and a TP size that keep them so")
    _warn_slow_fallback_once((a.granularity, b.granularity), why)


def fp8_gemm_accumulate(a: QTensor, b: QTensor, out: torch.Tensor, backend: str = "auto") -> None:
    """out [M, N] (FP32) += A [M, K] @ B [N, K]^T: the wgrad GEMM added into megatron's main_grad,
    in place where the backend can (token x token on scaled_mm), else through a temporary."""
    if a.granularity == b.granularity == "token" and resolve_backend(a, b, backend) == "scaled_mm":
        scaled_mm_blockwise_accumulate(a.data, outer_dim_major(a.scale), b.data, outer_dim_major(b.scale), out)
    else:
        out.add_(fp8_gemm(a, b, torch.float32, backend))


def fp8_gemm(a: QTensor, b: QTensor, out_dtype: torch.dtype = torch.bfloat16, backend: str = "auto") -> torch.Tensor:
    """C [M, N] = A [M, K] @ B [N, K]^T in out_dtype, accumulated in float32."""
    if a.data.shape[-1] != b.data.shape[-1]:
        raise ValueError(f"fp8_gemm: K mismatch, a is {tuple(a.data.shape)} and b is {tuple(b.data.shape)} (both K-last)")
    backend = resolve_backend(a, b, backend)
    if backend == "emulated":
        return emulated_gemm(a, b, out_dtype)
    if backend == "scaled_mm":
        return scaled_mm_gemm(a, b, out_dtype)
    from .kernels.gemm_two_level import two_level_gemm_triton

    return two_level_gemm_triton(a, b, out_dtype)
