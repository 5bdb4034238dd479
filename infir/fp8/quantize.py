"""Reference quantizers in plain PyTorch: the source of truth every kernel is tested against.

Granularities (the unit that shares one scale):
- "tensor":    one scale for the whole tensor (LLMQ's just-in-time per-tensor scaling, seed 000 §3).
- "token":     1 x 128 along the last dim, i.e. along the GEMM's K (InfiR2's activations / grads).
- "block":     128 x 128 over the last two dims (InfiR2's weights).
- "two_level": MOSS two-level microscaling (seed 002, Eq. 2-3) over groups of 32 along the last
               dim. Level 1 is one FP32 scale per row: MOSS leaves the span k1 of the global
               scale free and we take k1 = the whole row, which keeps quantization a single pass
               over the data and the GEMM epilogue a per-row multiply. Level 2 is an E8M0 power of
               two per group of 32: ss_i = 2^ceil(log2(s_i / s)), s_i = amax_i / fmax, s = max_i s_i.

dispatch.quantize picks these or the kernels (infir/fp8/kernels/, bit-identical); this module imports
no kernel. fold_two_level() turns a two-level tensor into the operand Hopper's tensor cores can consume
(granularity "row": FP8 data Q * ss_i, one FP32 scale per row); see its docstring.

Every quantizer returns a QTensor: `data` in the FP8 dtype with the input's shape, and `scale`
(float32) holding the dequantization multiplier of each unit, so dequantize(q) = data * scale.
Shapes that do not divide by the block are padded with zeros internally (zeros do not move amax).
Scale rules for zero and non-finite units are in formats.py.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from .formats import (
    Fp8Format,
    amax_with_nan_as_inf,
    cast_to_fp8,
    ceil_log2_exponent,
    check_scale_format,
    exp2_float32,
    get_format,
    round_scale,
    scale_from_amax,
)

GRANULARITIES = ("tensor", "token", "block", "two_level")
TOKEN_BLOCK = 128
WEIGHT_BLOCK = 128
MICRO_GROUP = 32


@dataclass
class QTensor:
    """An FP8 tensor with its dequantization scales.

    scale shapes: "tensor" -> []; "token" -> [..., ceil(K/128)]; "block" -> [..., ceil(M/128),
    ceil(K/128)]; "two_level" -> [..., ceil(K/32)] (the product s * ss_i), with `global_scale`
    [...] (s, FP32, one per row) and `local_exp` [..., ceil(K/32)] (ss_i as E8M0 uint8 codes);
    "row" (made only by fold_two_level) -> [..., 1].
    """

    data: torch.Tensor
    scale: torch.Tensor
    granularity: str
    scale_format: str = "ue8m0"
    fmt: str = "e4m3"
    global_scale: torch.Tensor | None = None
    local_exp: torch.Tensor | None = None
    # scales rearranged for a GEMM backend, kept with a weight's QTensor across micro-batches
    layout_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def t(self, transpose: Callable[[torch.Tensor], torch.Tensor] | None = None) -> "QTensor":
        """The transpose of a 2-D tensor- or block-quantized matrix, with the *same* FP8 values.

        A 128x128 block is a 128x128 block of W^T too, so dgrad reuses the weight's quantization
        instead of re-quantizing; only the bytes move, because Hopper's FP8 tensor cores read
        both operands K-major. transpose moves them (default transposed_reference;
        dispatch.transpose_q passes the Triton kernel on CUDA).
        """
        if self.data.dim() != 2 or self.granularity not in ("tensor", "block"):
            raise ValueError(
                f"QTensor.t() needs a 2-D 'tensor' or 'block' quantized matrix, got {self.granularity!r} "
                f"with shape {tuple(self.data.shape)}: token and two_level scales run along one dim only, "
                "re-quantize the transposed tensor instead"
            )
        scale = self.scale if self.granularity == "tensor" else self.scale.t().contiguous()
        return replace(self, data=(transpose or transposed_reference)(self.data), scale=scale)


def transposed_reference(x: torch.Tensor) -> torch.Tensor:
    """x^T [C, R] of a 2-D x [R, C], as a new contiguous tensor (FP8 through a uint8 view): the twin of
    kernels/transpose.py, which dispatch.transposed runs on CUDA."""
    if x.element_size() == 1:
        return x.view(torch.uint8).t().contiguous().view(x.dtype)
    return x.t().contiguous()




def _pad_last(x: torch.Tensor, multiple: int, dim: int = -1) -> torch.Tensor:
    size = x.shape[dim]
    pad = (-size) % multiple
    if pad == 0:
        return x
    pad_shape = list(x.shape)
    pad_shape[dim] = pad
    return torch.cat([x, x.new_zeros(pad_shape)], dim=dim)


def _expand(scale: torch.Tensor, block: int, size: int, dim: int) -> torch.Tensor:
    """Each scale repeated over its `block` positions along dim, cut to `size`.

    By index, not scale.repeat_interleave(block, dim).narrow(dim, 0, size): under torch.compile
    (inductor, torch 2.13 on CPU) that pair, fused into its consumer, read wrong scales whenever
    `size` is not a multiple of `block` (so did an expanded view, flattened and cut), and
    SwiGLU's FP8-saved input trained on NaN gradients at ffn=352."""
    idx = torch.arange(size, device=scale.device) // block
    return scale.index_select(dim, idx)


def check_input(x: torch.Tensor, granularity: str) -> None:
    """Raises for a granularity, dtype or rank that no quantizer takes."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown granularity {granularity!r}; use one of {list(GRANULARITIES)}")
    if not x.is_floating_point():
        raise TypeError(f"quantize needs a floating-point tensor, got {x.dtype}")
    min_dim = 2 if granularity == "block" else (1 if granularity != "tensor" else 0)
    if x.dim() < min_dim:
        raise ValueError(f"granularity {granularity!r} needs at least {min_dim} dims, got shape {tuple(x.shape)}")


def quantize_tensor_ref(x: torch.Tensor, fmt: Fp8Format, scale_format: str, scale: torch.Tensor | None = None) -> QTensor:
    """Per-tensor: scale from the tensor's amax (just in time), or a given scale (MOSS autoscale)."""
    if scale is None:
        scale = scale_from_amax(amax_with_nan_as_inf(x), fmt, scale_format)
    scale = scale.float().reshape(())
    data = cast_to_fp8(x.float() / scale, fmt)
    return QTensor(data, scale, "tensor", scale_format, fmt.name)


def quantize_token_ref(x: torch.Tensor, fmt: Fp8Format, scale_format: str) -> QTensor:
    k = x.shape[-1]
    xp = _pad_last(x.float(), TOKEN_BLOCK)
    amax = amax_with_nan_as_inf(xp.unflatten(-1, (-1, TOKEN_BLOCK)), dim=-1)
    scale = scale_from_amax(amax, fmt, scale_format)
    data = cast_to_fp8(x.float() / _expand(scale, TOKEN_BLOCK, k, -1), fmt)
    return QTensor(data, scale, "token", scale_format, fmt.name)


def quantize_block_ref(x: torch.Tensor, fmt: Fp8Format, scale_format: str) -> QTensor:
    m, k = x.shape[-2:]
    xp = _pad_last(_pad_last(x.float(), WEIGHT_BLOCK, -1), WEIGHT_BLOCK, -2)
    tiles = xp.unflatten(-1, (-1, WEIGHT_BLOCK)).unflatten(-3, (-1, WEIGHT_BLOCK))  # [..., Mb, 128, Kb, 128]
    amax = amax_with_nan_as_inf(tiles, dim=(-3, -1))
    scale = scale_from_amax(amax, fmt, scale_format)
    full = _expand(_expand(scale, WEIGHT_BLOCK, k, -1), WEIGHT_BLOCK, m, -2)
    data = cast_to_fp8(x.float() / full, fmt)
    return QTensor(data, scale, "block", scale_format, fmt.name)


def two_level_scales(group_amax: torch.Tensor, fmt: Fp8Format, scale_format: str):
    """MOSS Eq. 2-3 from per-group amax [..., G]: (effective scale, global scale, E8M0 codes).

    Eq. 2: s_i = amax_i / fmax.  Eq. 3: s = max_i s_i (per row), ss_i = 2^ceil(log2(s_i / s)).
    A group of zeros gets ss_i = 1 (any value would do; 1 keeps s * ss_i away from underflow).
    """
    s_i = group_amax / fmt.max
    s = round_scale(s_i.amax(dim=-1), scale_format)  # NaN-as-inf amax makes s NaN for the row
    ratio = s_i / s.unsqueeze(-1)
    e = torch.where(group_amax == 0, torch.zeros_like(ratio, dtype=torch.int32), ceil_log2_exponent(ratio))
    finite_row = torch.isfinite(s).unsqueeze(-1)
    code = torch.where(finite_row, e + 127, torch.full_like(e, 255)).to(torch.uint8)
    local = exp2_float32(e)
    eff = torch.where(finite_row, s.unsqueeze(-1) * local, torch.full_like(local, float("nan")))
    return eff, s, code


def quantize_two_level_ref(x: torch.Tensor, fmt: Fp8Format, scale_format: str) -> QTensor:
    k = x.shape[-1]
    xp = _pad_last(x.float(), MICRO_GROUP)
    group_amax = amax_with_nan_as_inf(xp.unflatten(-1, (-1, MICRO_GROUP)), dim=-1)
    eff, s, code = two_level_scales(group_amax, fmt, scale_format)
    data = cast_to_fp8(x.float() / _expand(eff, MICRO_GROUP, k, -1), fmt)
    return QTensor(data, eff, "two_level", scale_format, fmt.name, global_scale=s, local_exp=code)


_REFERENCE = {
    "tensor": quantize_tensor_ref,
    "token": quantize_token_ref,
    "block": quantize_block_ref,
    "two_level": quantize_two_level_ref,
}


def quantize_reference(x: torch.Tensor, granularity: str, scale_format: str = "ue8m0", fmt: str = "e4m3") -> QTensor:
    """quantize() in plain PyTorch: any device, any leading dims (batched blocks too)."""
    check_input(x, granularity)
    check_scale_format(scale_format)
    return _REFERENCE[granularity](x, get_format(fmt), scale_format)


def fold_two_level(q: QTensor) -> QTensor:
    """MOSS's GEMM operand Q_x * ss_x (seed 002, Figure 3b) as a row-scaled FP8 tensor.

    Hopper has no tensor-core path for per-32 scales (Blackwell's MXFP8 has), so the level-2
    power of two is folded into the FP8 data: data = fp8(Q_i * ss_i), scale = s per row. For any
    value that stays in the format's normal range this is exact (a power-of-two shift moves only
    the exponent); values pushed below it (|Q_i * ss_i| < 2^-6 in E4M3) are re-rounded to the
    subnormal grid. The GEMM is then a row-wise scaled FP8 GEMM with the global scales applied
    in the epilogue, as MOSS prescribes.
    """
    if q.granularity != "two_level":
        raise ValueError(f"fold_two_level needs a two_level QTensor, got {q.granularity!r}")
    local = _expand(exp2_float32(q.local_exp.to(torch.int32) - 127), MICRO_GROUP, q.data.shape[-1], -1)
    data = cast_to_fp8(q.data.float() * local, get_format(q.fmt))
    return QTensor(data, q.global_scale.unsqueeze(-1), "row", q.scale_format, q.fmt)


def dequantize(q: QTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """data * scale, each scale broadcast over its unit, computed in float32."""
    d = q.data.float()
    if q.granularity == "tensor":
        full = q.scale
    elif q.granularity == "token":
        full = _expand(q.scale, TOKEN_BLOCK, d.shape[-1], -1)
    elif q.granularity == "two_level":
        full = _expand(q.scale, MICRO_GROUP, d.shape[-1], -1)
    elif q.granularity == "row":
        full = q.scale
    elif q.granularity == "block":
        full = _expand(_expand(q.scale, WEIGHT_BLOCK, d.shape[-1], -1), WEIGHT_BLOCK, d.shape[-2], -2)
    else:
        raise ValueError(f"unknown granularity {q.granularity!r}")
    return (d * full).to(dtype)


def quantization_snr_db(x: torch.Tensor, q: QTensor) -> float:
    """MOSS Eq. 4: 10 log10(E[x^2] / E[(DQ(x) - x)^2]) in dB (inf when exact)."""
    xf = x.double()
    noise = (dequantize(q, torch.float64) - xf).pow(2).mean()
    signal = xf.pow(2).mean()
    return float(10 * torch.log10(signal / noise))


def quant_stats(x: torch.Tensor, q: QTensor) -> dict:
    """Health numbers of one quantization, for a training monitor.

    amax: max |x|; saturated: fraction of elements at +-fmax after scaling (clipped or at the
    edge); underflow: fraction of non-zero x that quantized to 0; snr_db: MOSS Eq. 4.
    """
    fmax = get_format(q.fmt).max
    qd = q.data.float()
    xf = x.float()
    nonzero = xf != 0
    n_nonzero = nonzero.sum().clamp_min(1)
    return {
        "amax": float(xf.abs().amax()) if x.numel() else 0.0,
        "saturated": float((qd.abs() >= fmax).float().mean()),
        "underflow": float(((qd == 0) & nonzero).sum() / n_nonzero),
        "snr_db": quantization_snr_db(x, q),
    }
