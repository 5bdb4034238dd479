"""Fused FlashAdamW step: one pass over weight, correction, gradient and the two 8-bit states.

Twin of flash_adamw.flash_adamw_reference, bit for bit: correctly rounded division and square
root, no fused multiply-add (``enable_fp_fusion=False``), powers of two built from bits.
Memory-bound in principle (~12 bytes per parameter against 28 for fused fp32 AdamW), so the
kernel keeps the arithmetic per element small:
- decoding an 8-bit code is a function of the code alone (companding.momentum_unit,
  variance_unit, weight_split.correction_unit): three 256-entry fp32 tables, built once per
  device by the twin's own functions, replace four divisions per element;
- tiles are 2-D, one row per 32-element group, so group maxima and scales broadcast along rows
  without layout shuffles;
- ``FAST_DIV``: divisions by a value shared by many elements (the two bias corrections, a
  group's absmax) multiply by its correctly rounded reciprocal and correct the quotient with
  one fused multiply-add (Markstein: q = a*y, r = fma(-q, b, a), q' = fma(r, y, q) with
  y = RN(1/b) gives RN(a/b) whenever the residual is a normal number, i.e. for every quotient
  that can change a result here; zeros, infinities and NaN take q = a*y, which has the sign
  and class of a/b). Three instructions instead of an IEEE division per element.

Launches: one per parameter (``flash_adamw_triton_``, from step() and inside backward hooks), through
a cached direct launcher (infir.kernel_launch). One launch over all parameters of a step (a pointer
table driving one grid) was tried and was not faster on an H100: the kernel time, not the launch
count, dominates the step.
"""
import functools

import numpy as np
import torch
import triton
import triton.language as tl

from infir.kernel_launch import Launch, grid1d
from infir.optim.adam_math import AdamScalars
from infir.optim.companding import GROUP, momentum_unit, num_groups, variance_unit
from infir.optim.triton_bits import bf16_half_ulp_log2, bf16_round_nearest, pow2
from infir.optim.weight_split import correction_unit

# groups per program (512 elements) and warps: the fastest of bench/optim.py's configuration sweep on an
# H100, ahead of wider programs with IEEE division; neighbouring variants differ by about run-to-run noise
ROWS = 16
NUM_WARPS = 2
FAST_DIV = True

_tables: dict[torch.device, torch.Tensor] = {}


def decode_tables(device) -> torch.Tensor:
    """fp32 (3, 256): momentum, variance and correction values of each code (index code + 128
    for the signed ones, code for uint8)."""
    device = torch.device(device)
    if device not in _tables:
        signed = torch.arange(-128, 128, dtype=torch.int32)
        unsigned = torch.arange(0, 256, dtype=torch.int32)
        _tables[device] = torch.stack([momentum_unit(signed), variance_unit(unsigned),
                                       correction_unit(signed)]).to(device)
    return _tables[device]


def reciprocal_f32(x: float) -> float:
    """RN(1/x) in fp32 (numpy's fp32 division is IEEE)."""
    return float(np.float32(1.0) / np.float32(x))


@triton.jit
def _div(a, b, inv_b, FAST_DIV: tl.constexpr):
    """RN(a / b); ``inv_b`` = RN(1 / b) (see the module docstring)."""
    if FAST_DIV:
        q = a * inv_b
        r = tl.fma(-q, b, a)
        return tl.where((q == 0.0) | (r != r), q, tl.fma(r, inv_b, q))
    else:
        return tl.div_rn(a, b)


@triton.jit
def _step_tile(p_ptr, g_ptr, corr_ptr, mq_ptr, ms_ptr, vq_ptr, vs_ptr, table_ptr, n, rows,
               lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, decay,
               bias_correction1, bias_correction2, inv_bias_correction1, inv_bias_correction2,
               HAS_CORRECTION: tl.constexpr, GROUP: tl.constexpr, FAST_DIV: tl.constexpr):
    offs = rows[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    rmask = rows < (n + GROUP - 1) // GROUP
    mask = offs < n

    # decode: master weight (Algorithm 1), momentum (softsign, Alg. 2), variance (sqrt, Alg. 3)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    narrow = tl.load(p_ptr + offs, mask=mask, other=0.0)
    master = narrow.to(tl.float32)
    if HAS_CORRECTION:
        corr = tl.load(corr_ptr + offs, mask=mask, other=0).to(tl.int32)
        k = bf16_half_ulp_log2(narrow)
        half = k >> 1  # arithmetic shift: floor(k / 2)
        master = master + tl.load(table_ptr + 512 + 128 + corr) * pow2(half) * pow2(k - half)
    mq = tl.load(mq_ptr + offs, mask=mask, other=0).to(tl.int32)
    m = tl.load(table_ptr + 128 + mq) * tl.load(ms_ptr + rows, mask=rmask, other=0.0).to(tl.float32)[:, None]
    vq = tl.load(vq_ptr + offs, mask=mask, other=0).to(tl.int32)
    root = tl.load(table_ptr + 256 + vq) * tl.load(vs_ptr + rows, mask=rmask, other=0.0).to(tl.float32)[:, None]
    v = root * root

    # AdamW, op for op as adam_math.adamw_fp32
    m = m * beta1 + g * one_minus_beta1
    v = v * beta2 + g * g * one_minus_beta2
    master = master * decay
    denom = tl.sqrt_rn(_div(v, bias_correction2, inv_bias_correction2, FAST_DIV)) + eps
    master = master - tl.div_rn(_div(m, bias_correction1, inv_bias_correction1, FAST_DIV) * lr, denom)

    # encode
    if HAS_CORRECTION:
        narrow = bf16_round_nearest(master)
        err = master - narrow.to(tl.float32)
        k = -bf16_half_ulp_log2(narrow)
        half = k >> 1
        ratio = err * pow2(half) * pow2(k - half)
        ratio = tl.minimum(tl.maximum(ratio, -1.0), 1.0) * 127.0
        mag = tl.floor(tl.abs(ratio) + 0.5)
        tl.store(corr_ptr + offs, tl.where(ratio < 0, -mag, mag).to(tl.int8), mask=mask)
        tl.store(p_ptr + offs, narrow, mask=mask)
    else:
        tl.store(p_ptr + offs, master, mask=mask)

    _store_states(m, v, mq_ptr, ms_ptr, vq_ptr, vs_ptr, offs, rows, mask, rmask, FAST_DIV)


@triton.jit
def _store_states(m, v, mq_ptr, ms_ptr, vq_ptr, vs_ptr, offs, rows, mask, rmask, FAST_DIV: tl.constexpr):
    """Encode the new momentum (softsign companding) and variance (sqrt companding), one scale per row."""
    m_absmax = tl.maximum(tl.max(tl.abs(m), axis=1), 1e-12)
    if FAST_DIV:
        m_inv = tl.div_rn(1.0, m_absmax)  # one division per group, not per element
        x = _div(m, m_absmax[:, None], m_inv[:, None], True)
    else:
        x = tl.div_rn(m, m_absmax[:, None])
    y = tl.div_rn(2.0 * x, 1.0 + tl.abs(x))
    tl.store(mq_ptr + offs, tl.floor(y * 127.0 + 0.5).to(tl.int8), mask=mask)
    tl.store(ms_ptr + rows, m_absmax.to(tl.float16), mask=rmask)

    root = tl.sqrt_rn(v)
    v_absmax = tl.maximum(tl.max(root, axis=1), 1e-12)
    if FAST_DIV:
        v_inv = tl.div_rn(1.0, v_absmax)
        q = _div(root, v_absmax[:, None], v_inv[:, None], True)
    else:
        q = tl.div_rn(root, v_absmax[:, None])
    q = tl.floor(q * 255.0 + 0.5)
    tl.store(vq_ptr + offs, q.to(tl.uint8), mask=mask)
    tl.store(vs_ptr + rows, v_absmax.to(tl.float16), mask=rmask)


@triton.jit
def _flash_adamw_kernel(p_ptr, g_ptr, corr_ptr, mq_ptr, ms_ptr, vq_ptr, vs_ptr, table_ptr, n,
                        lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, decay,
                        bias_correction1, bias_correction2, inv_bias_correction1,
                        inv_bias_correction2, HAS_CORRECTION: tl.constexpr, ROWS: tl.constexpr,
                        GROUP: tl.constexpr, FAST_DIV: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    _step_tile(p_ptr, g_ptr, corr_ptr, mq_ptr, ms_ptr, vq_ptr, vs_ptr, table_ptr, n, rows,
               lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, decay,
               bias_correction1, bias_correction2, inv_bias_correction1, inv_bias_correction2,
               HAS_CORRECTION=HAS_CORRECTION, GROUP=GROUP, FAST_DIV=FAST_DIV)


def _check_contiguous(tensors) -> None:
    for t in tensors:
        if t is not None and not t.is_contiguous():
            raise ValueError(f"the fused FlashAdamW step needs contiguous tensors; got strides "
                             f"{t.stride()} for shape {tuple(t.shape)} (pass fused=False)")


@functools.lru_cache(maxsize=64)  # every param of a group shares one AdamScalars per step
def _scalar_args(s: AdamScalars) -> tuple:
    return (s.lr, s.beta1, s.beta2, s.one_minus_beta1, s.one_minus_beta2, s.eps, s.decay,
            s.bias_correction1, s.bias_correction2, reciprocal_f32(s.bias_correction1),
            reciprocal_f32(s.bias_correction2))


def flash_adamw_triton_(param: torch.Tensor, grad: torch.Tensor, correction, m_codes, m_scales,
                        v_codes, v_scales, s: AdamScalars, *, rows: int = None,
                        num_warps: int = None, fast_div: bool = None) -> None:
    """In-place fused step of one parameter; same arguments as flash_adamw_reference."""
    n = param.numel()
    if n == 0:
        return
    _check_contiguous((param, grad, m_codes, v_codes, correction))
    if m_scales.numel() != num_groups(n) or v_scales.numel() != num_groups(n):
        raise ValueError(f"{n} elements need {num_groups(n)} scales per state, got "
                         f"{m_scales.numel()} and {v_scales.numel()}")
    rows = rows or ROWS
    num_warps = num_warps or NUM_WARPS
    fast_div = FAST_DIV if fast_div is None else fast_div
    has_corr = correction is not None
    tensors = (param, grad, correction if has_corr else m_codes, m_scales, v_codes, v_scales, m_codes)
    # keyed on what Triton specializes on: sizes, dtypes, 16-byte alignment (megatron's grad buffers
    # hand out views at any offset), constexprs
    key = (n, param.dtype, grad.dtype, param.device, has_corr, rows, num_warps, fast_div,
           tuple(t.data_ptr() % 16 == 0 for t in tensors))
    launch = _LAUNCHES.get(key)
    if launch is None:
        launch = _LAUNCHES[key] = Launch(_flash_adamw_kernel, grid1d(triton.cdiv(num_groups(n), rows)), num_warps,
                                         enable_fp_fusion=False)
    launch(param.device.index, param, grad, tensors[2], m_codes, m_scales, v_codes, v_scales,
           decode_tables(param.device), n, *_scalar_args(s), has_corr, rows, GROUP, fast_div)


# One launcher per parameter shape and configuration, to cut the host time that made step() slower
# than its kernels run back to back (bench/optim.py times both).
_LAUNCHES: dict = {}
