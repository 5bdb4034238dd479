"""Which implementation runs each FP8 quantization: the plain-PyTorch reference (quantize.py, any
device) or a fast kernel (kernels/: Triton, and CUDA C++ where built), bit-identical either way.

The kernels run on CUDA tensors (and in Triton's interpreter where a test asks for them); which
kernels may run and how their configurations are picked is the process's KernelPolicy (policy.py,
re-exported here), read once from INFIR_CUDA_KERNELS, INFIR_FP8_AUTOTUNE and TRITON_INTERPRET.

- quantize(x, granularity, ...): one tensor, any granularity and leading dims.
- quantize_pair(x2, granularity, ...): a GEMM operand in the layouts its GEMMs read: x2 along K for
  fprop/dgrad and x2^T along M for wgrad, MOSS operands folded into the row-scaled form Hopper takes.
- quantize_weight(w, ...): a weight, per 128x128 block or per tensor (MOSS's predicted scale).
- transposed(x) / transpose_q(q): the backward's transposes (W^T for dgrad, per-tensor X^T).
- block_range_amax / quantize_block_range: a ZeRO-1 shard of a weight, under the whole weight's block scales.

The kernels are imported on first use, so that importing infir.fp8 loads no Triton kernel (a test
may still choose the interpreter before its first kernel call).
"""
from __future__ import annotations

import torch

from .block_range import block_range_amax_reference, quantize_block_range_reference
from .formats import check_scale_format, get_format
from .policy import KernelPolicy, kernel_policy, policy_override
from .quantize import QTensor, check_input, fold_two_level, quantize_reference, quantize_tensor_ref, transposed_reference

IMPLS = ("auto", "reference", "triton")
__all__ = ["KernelPolicy", "block_range_amax", "kernel_policy", "policy_override", "quantize", "quantize_block_range",
           "quantize_pair", "quantize_weight", "transpose_q", "transposed"]


def quantize(x: torch.Tensor, granularity: str, scale_format: str = "ue8m0", fmt: str = "e4m3",
             impl: str = "auto") -> QTensor:
    """Quantize x to FP8. impl: "reference" (plain PyTorch), "triton", or "auto" (Triton on CUDA).

    Both give bit-identical results (tests/fp8/test_kernel_pairs.py holds them together)."""
    check_input(x, granularity)
    check_scale_format(scale_format)
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; use one of {list(IMPLS)}")
    if impl == "auto":
        impl = "triton" if x.is_cuda else "reference"
    if impl == "reference":
        return quantize_reference(x, granularity, scale_format, fmt)
    from .kernels import quantize_triton

    return quantize_triton(x, granularity, scale_format, fmt)


def quantize_pair(x2: torch.Tensor, granularity: str, scale_format: str, fmt: str, rows: bool = True,
                  cols: bool = False) -> tuple[QTensor | None, QTensor | None]:
    """x2 [M, K] -> (x2 quantized along K as [M, K] if rows, x2^T quantized along M as [K, M] if cols).

    granularity: "token", "tensor" or "two_level" (an activation's or gradient's); two-level operands
    come back folded (quantize.fold_two_level), the form Hopper's GEMM takes. On CUDA the kernels
    (both token layouts in one launch), elsewhere the reference.
    """
    if granularity not in ("token", "tensor", "two_level"):
        raise ValueError(f"quantize_pair takes 'token', 'tensor' or 'two_level' operands, got {granularity!r}")
    if x2.is_cuda:
        return _kernel_pair(x2, granularity, scale_format, fmt, rows, cols)
    if granularity == "two_level":
        quant = lambda t: fold_two_level(quantize_reference(t, granularity, scale_format, fmt))
    else:
        quant = lambda t: quantize_reference(t, granularity, scale_format, fmt)
    q = quant(x2) if rows else None
    if not cols:
        return q, None
    qt = q.t() if (granularity == "tensor" and q is not None) else quant(x2.t())
    return q, qt


def _kernel_pair(x2, granularity, scale_format, fmt, rows, cols):
    from . import kernels as kn

    if x2.stride(-1) != 1:  # the kernels index rows by stride and walk K contiguously
        x2 = x2.contiguous()
    if granularity == "token":
        return kn.quantize_token_triton(x2, scale_format, fmt, rows=rows, cols=cols)
    if granularity == "tensor":
        q, qt = kn.quantize_tensor_triton(x2, scale_format, fmt, transpose=cols)
        return (q if rows else None), qt
    q = kn.quantize_two_level_triton(x2, scale_format, fmt, fold=True) if rows else None
    qt = kn.quantize_two_level_triton(transposed(x2), scale_format, fmt, fold=True) if cols else None
    return q, qt


def transposed(x: torch.Tensor) -> torch.Tensor:
    """x^T [C, R] of a 2-D x [R, C], as a new contiguous tensor: on CUDA the Triton kernel
    (kernels/transpose.py: torch's transposing copy of FP8 bytes ran far under HBM bandwidth there),
    elsewhere quantize.transposed_reference; the same bytes."""
    if x.is_cuda:
        from .kernels import transpose_2d

        return transpose_2d(x)
    return transposed_reference(x)


def transpose_q(q: QTensor) -> QTensor:
    """q.t() (a 2-D tensor- or block-quantized matrix transposed, the same FP8 values) with the bytes
    moved by transposed: dgrad's W^T."""
    return q.t(transposed)


def quantize_weight(w: torch.Tensor, granularity: str, scale_format: str, fmt: str, scale: torch.Tensor | None = None,
                    record_amax: torch.Tensor | None = None) -> QTensor:
    """A weight [N, K] quantized per 128x128 'block' or per 'tensor' (a given per-tensor `scale` is MOSS's
    predicted one, and `record_amax` receives the true amax on a GPU, which the kernel measures for free)."""
    if granularity == "block":
        if w.is_cuda:
            from .kernels import quantize_block_triton

            return quantize_block_triton(w, scale_format, fmt)
        return quantize_reference(w, "block", scale_format, fmt)
    if w.is_cuda:
        from .kernels import quantize_tensor_triton

        q, _ = quantize_tensor_triton(w, scale_format, fmt, scale=scale, record_amax=record_amax)
        return q
    return quantize_tensor_ref(w, get_format(fmt), scale_format, scale=scale)


def block_range_amax(flat: torch.Tensor, start: int, shape: tuple[int, int], out: torch.Tensor) -> torch.Tensor:
    """Per-block amax of a weight's element range [start, start + flat.numel()) into out's rows of the
    128-row bands it touches (block_range.py): a ZeRO-1 shard's part of the whole weight's block scales."""
    if flat.is_cuda:
        from .kernels.quant_block_range import block_range_amax_triton

        return block_range_amax_triton(flat, start, shape, out)
    return block_range_amax_reference(flat, start, shape, out)


def quantize_block_range(flat: torch.Tensor, start: int, shape: tuple[int, int], scale: torch.Tensor,
                         scale_format: str, fmt: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """The range's FP8 bytes under the whole weight's 128x128 block scales (into `out` where given)."""
    if flat.is_cuda:
        from .kernels.quant_block_range import quantize_block_range_triton

        return quantize_block_range_triton(flat, start, shape, scale, scale_format, fmt, out)
    q = quantize_block_range_reference(flat, start, shape, scale, fmt)
    return q if out is None else out.copy_(q)
