"""The FP8 linear's quantizers and GEMMs as opaque graph ops (oplib.py), over the same kernels as eager code.

Why ops: inside a compiled layer dynamo keeps the whole layer as one graph, with each quantizer and GEMM
an opaque call whose host cost is one dispatch; outside a compiled region the same ops run eagerly, so the
linear has one implementation whatever calls it. Their common case (token activations, block or token B
on an sm90 GPU) goes straight to the kernel and to one scaled_mm call with the weight's scale layouts made
once a step: every microsecond these ops spend on the host is spent ~20 times per layer and micro-batch.

Quantizing with torch ops instead, so that inductor fuses it into the norm or SwiGLU before it, was
tried and was slower end to end on an H100: inductor's code for the transposed 128x1 quantization
(X^T for wgrad) ran far under the Triton kernels' bandwidth.
"""
from __future__ import annotations

import torch

from .formats import get_format
from .gemm import blockwise_dtypes_ok, fp8_gemm, fp8_gemm_accumulate, is_sm90, outer_dim_major, scaled_mm_blockwise
from .oplib import define_op
from .dispatch import quantize_pair, transpose_q, transposed
from .quantize import TOKEN_BLOCK, QTensor
from .sp_overlap import concat_rows, gather_mm, mm_reduce_scatter
from .recipe import OperandFormat


def _fp8_mm(a: torch.Tensor, a_scale: torch.Tensor, a_gran: str, b: torch.Tensor, b_scale: torch.Tensor, b_gran: str,
            out_dtype: torch.dtype, b_transposed: bool = False, b_mm_scale: torch.Tensor | None = None,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """C [M, N] = A [M, K] @ B [N, K]^T for FP8 data + scales of the given granularities (gemm.fp8_gemm).

    b_transposed: b is stored [K, N] (W for dgrad); its bytes are transposed here and freed after
    the GEMM. Inside this op, and not as an op of its own, because the partitioner runs an opaque op
    that needs only forward inputs in the forward and saves its output: W^T would then be made for
    every layer in the forward and held until its backward.
    b_mm_scale: a 'block' b's scale (of b^T when b_transposed) already in scaled_mm's layout
    (gemm.scaled_mm_scale, made once a step by the weight cache); with it, and token A on an sm90
    GPU, the GEMM is one scaled_mm call with no per-call layout work.
    out: a contiguous [M, N] tensor to write C into (the sequence-parallel schedules' rows of one product).
    """
    m, k = a.shape
    n = b.shape[1 if b_transposed else 0]
    fast = (a_gran == "token" and is_sm90(a) and m % 16 == 0 and k % 128 == 0 and n % 128 == 0
            and blockwise_dtypes_ok(a, b)
            and ((b_gran == "block" and b_mm_scale is not None) or (b_gran == "token" and not b_transposed)))
    if fast:
        bk = transposed(b) if b_transposed else b
        # token scales come from the quantize op outer-dim-major; rows of one (the split schedules') are restrided
        return scaled_mm_blockwise(a, outer_dim_major(a_scale), bk, b_scale if b_gran == "token" else b_mm_scale,
                                   b_gran, out_dtype, out)
    # Inductor may hand over any strides; the GEMM wants K-major data (scale layouts are fixed in gemm.py).
    qa = QTensor(a.contiguous(), a_scale, a_gran)
    qb = QTensor(b.contiguous(), b_scale, b_gran)
    c = fp8_gemm(qa, transpose_q(qb) if b_transposed else qb, out_dtype=out_dtype)
    return c if out is None else out.copy_(c)


def _fp8_mm_fake(a, a_scale, a_gran, b, b_scale, b_gran, out_dtype, b_transposed=False, b_mm_scale=None):
    return a.new_empty((a.shape[0], b.shape[1 if b_transposed else 0]), dtype=out_dtype)


fp8_mm = define_op(
    "fp8_mm", "(Tensor a, Tensor a_scale, str a_gran, Tensor b, Tensor b_scale, str b_gran, ScalarType out_dtype, "
    "bool b_transposed=False, Tensor? b_mm_scale=None) -> Tensor", _fp8_mm, _fp8_mm_fake)


def _rows(t: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Rows lo:hi of an operand's data or scale (a view; _fp8_mm restrides a token scale's rows for the
    GEMM), a 0-dim tensor-wise scale whole."""
    return t if t.dim() == 0 else t[lo:hi]


def _fp8_gather_mm(a: torch.Tensor, a_scale: torch.Tensor, a_gran: str, b: torch.Tensor, b_scale: torch.Tensor,
                   b_gran: str, out_dtype: torch.dtype, b_transposed: bool, b_mm_scale: torch.Tensor | None, group: str,
                   world: int, extra: list[torch.Tensor], extra_dims: list[int]):
    """C [W*m, N] = (every rank's A rows, in rank order) @ B^T, with A's all-gather over the group split per
    rank and overlapped with the GEMMs (sp_overlap.gather_mm); `extra` tensors travel with A and come back
    gathered, each joined along its `extra_dims` entry (the backward's dY^T beside dY)."""
    m = a.shape[0]
    out = a.new_empty((m * world, b.shape[1 if b_transposed else 0]), dtype=out_dtype)

    def mm(j: int, tensors) -> None:
        _fp8_mm(tensors[0], tensors[1], a_gran, b, b_scale, b_gran, out_dtype, b_transposed, b_mm_scale,
                out=out[j * m:(j + 1) * m])

    everyone = gather_mm([a, a_scale, *extra], mm, group)
    return out, [concat_rows([tensors[2 + i] for tensors in everyone], d) for i, d in enumerate(extra_dims)]


def _fp8_gather_mm_fake(a, a_scale, a_gran, b, b_scale, b_gran, out_dtype, b_transposed, b_mm_scale, group, world,
                        extra, extra_dims):
    out = a.new_empty((a.shape[0] * world, b.shape[1 if b_transposed else 0]), dtype=out_dtype)
    return out, [concat_rows([torch.empty_like(t)] * world, d) for t, d in zip(extra, extra_dims)]


fp8_gather_mm = define_op(
    "fp8_gather_mm", "(Tensor a, Tensor a_scale, str a_gran, Tensor b, Tensor b_scale, str b_gran, ScalarType out_dtype, "
    "bool b_transposed, Tensor? b_mm_scale, str group, int world, Tensor[] extra, int[] extra_dims) -> (Tensor, Tensor[])",
    _fp8_gather_mm, _fp8_gather_mm_fake)


def _fp8_mm_reduce_scatter(a: torch.Tensor, a_scale: torch.Tensor, a_gran: str, b: torch.Tensor, b_scale: torch.Tensor,
                           b_gran: str, out_dtype: torch.dtype, b_transposed: bool, b_mm_scale: torch.Tensor | None,
                           group: str, world: int) -> torch.Tensor:
    """This rank's m = M/W rows of sum over the group of A [M, K] @ B^T (each rank's A and B its K-shards: a
    row-parallel fprop; or dY and W for a column-parallel dgrad, B stored transposed), with the reduce-scatter
    split per rank and overlapped with the GEMMs (sp_overlap.mm_reduce_scatter)."""
    m = a.shape[0] // world

    def mm(j: int) -> torch.Tensor:
        lo, hi = j * m, (j + 1) * m
        return _fp8_mm(_rows(a, lo, hi), _rows(a_scale, lo, hi), a_gran, b, b_scale, b_gran, out_dtype, b_transposed,
                       b_mm_scale)

    return mm_reduce_scatter(mm, group)


fp8_mm_reduce_scatter = define_op(
    "fp8_mm_reduce_scatter", "(Tensor a, Tensor a_scale, str a_gran, Tensor b, Tensor b_scale, str b_gran, "
    "ScalarType out_dtype, bool b_transposed, Tensor? b_mm_scale, str group, int world) -> Tensor",
    _fp8_mm_reduce_scatter,
    lambda a, a_scale, a_gran, b, b_scale, b_gran, out_dtype, b_transposed, b_mm_scale, group, world:
        a.new_empty((a.shape[0] // world, b.shape[1 if b_transposed else 0]), dtype=out_dtype))


def _fp8_gather_wgrad(a: torch.Tensor, a_scale: torch.Tensor, a_gran: str, b: torch.Tensor, b_scale: torch.Tensor,
                      b_gran: str, weight: torch.Tensor | None, group: str, world: int) -> torch.Tensor:
    """dW [N, K] = A [N, M] @ (every rank's B [K, m], in rank order)^T, the wgrad of a column-parallel linear
    under sequence parallelism (A: dY^T along all M tokens, B: this rank's X^T shard), with B's all-gather split
    per rank and overlapped with the GEMMs (sp_overlap.gather_mm): each rank's shard is multiplied by A's
    columns of its tokens as it lands, the products summed in FP32. With `weight`: summed into its main_grad,
    and an unwritten placeholder returned (as fp8_wgrad_main_grad); else dW in FP32. A's 128-token scale
    groups line up with the shards (SequenceParallel.takes)."""
    m = b.shape[1]
    acc = weight.main_grad if weight is not None else a.new_zeros((a.shape[0], b.shape[0]), dtype=torch.float32)

    def mm(j: int, tensors) -> None:
        lo, hi = j * m, (j + 1) * m
        # views: the wgrad GEMM reads A's columns with A's row stride (lt_wgrad), and an outer-dim-major
        # scale's columns are contiguous runs of it
        qa = QTensor(a[:, lo:hi], a_scale[:, lo // TOKEN_BLOCK:hi // TOKEN_BLOCK], a_gran)
        qb = QTensor(tensors[0].contiguous(), tensors[1], b_gran)
        fp8_gemm_accumulate(qa, qb, acc)

    gather_mm([b, b_scale], mm, group)
    return torch.empty_like(weight) if weight is not None else acc


def _fp8_gather_wgrad_fake(a, a_scale, a_gran, b, b_scale, b_gran, weight, group, world):
    if weight is not None:
        return torch.empty_like(weight)
    return a.new_empty((a.shape[0], b.shape[0]), dtype=torch.float32)


fp8_gather_wgrad = define_op(
    "fp8_gather_wgrad", "(Tensor a, Tensor a_scale, str a_gran, Tensor b, Tensor b_scale, str b_gran, Tensor? weight, "
    "str group, int world) -> Tensor", _fp8_gather_wgrad, _fp8_gather_wgrad_fake)


def _fp8_wgrad_main_grad(a: torch.Tensor, a_scale: torch.Tensor, a_gran: str, b: torch.Tensor, b_scale: torch.Tensor,
                         b_gran: str, weight: torch.Tensor) -> torch.Tensor:
    """weight.main_grad += A [N, M] @ B [K, M]^T (the wgrad product, gemm.fp8_gemm_accumulate), and an
    unwritten placeholder of the weight's shape for autograd, which megatron's grad hook skips
    (grad_added_to_main_grad, set by infir.model.fp8_linears.attach_weight_refresh).

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


def _quantize_pair(x2: torch.Tensor, granularity: str, scale_format: str, fmt: str, cols: bool):
    q, qt = quantize_pair(x2, granularity, scale_format, fmt, rows=True, cols=cols)
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


def gemm_granularity(granularity: str) -> str:
    """The GEMM's name for an operand granularity (two-level operands come folded to rows)."""
    return "row" if granularity == "two_level" else granularity


def quantize_operand(x2: torch.Tensor, fmt: OperandFormat, cols: bool):
    """(data, scale, granularity) of x2 along K, and of x2^T along M when `cols` (else None), in the
    operand format `fmt`: dispatch.quantize_pair as one opaque op (kernels on a GPU, the reference elsewhere)."""
    q, s, qt, st = _quantize_pair_op(x2, fmt.granularity, fmt.scale_format, fmt.fmt, cols)
    gran = gemm_granularity(fmt.granularity)
    return (q, s, gran), ((qt, st, gran) if cols else None)
