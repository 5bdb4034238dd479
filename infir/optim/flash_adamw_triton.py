"""Fused FlashAdamW step: one pass over weight, correction, gradient and the two 8-bit states.

Twin of flash_adamw.flash_adamw_reference, bit for bit: true division and square root
(``div_rn``/``sqrt_rn``), no fused multiply-add (``enable_fp_fusion=False``), powers of two built
from bits. Memory-bound in principle (~12 bytes per parameter against 28 for fused fp32 AdamW),
but IEEE division is ~10 instructions, so the kernel avoids what it can:
- decoding an 8-bit code is a function of the code alone (companding.momentum_unit,
  variance_unit, weight_split.correction_unit): three 256-entry fp32 tables, built once per
  device by the twin's own functions, replace four divisions per element;
- tiles are 2-D, one row per 32-element group, so group maxima and scales broadcast along rows
  without layout shuffles.
"""
import torch
import triton
import triton.language as tl

from infir.optim.adam_math import AdamScalars
from infir.optim.companding import GROUP, momentum_unit, num_groups, variance_unit
from infir.optim.triton_bits import bf16_half_ulp_log2, bf16_round_nearest, pow2
from infir.optim.weight_split import correction_unit

ROWS = 32  # groups per program: 1024 elements

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


@triton.jit
def _flash_adamw_kernel(p_ptr, g_ptr, corr_ptr, mq_ptr, ms_ptr, vq_ptr, vs_ptr, table_ptr, n,
                        lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, decay,
                        bias_correction1, bias_correction2,
                        HAS_CORRECTION: tl.constexpr, ROWS: tl.constexpr, GROUP: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    offs = rows[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    mask = offs < n
    rmask = rows < (n + GROUP - 1) // GROUP

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
    denom = tl.sqrt_rn(tl.div_rn(v, bias_correction2)) + eps
    master = master - tl.div_rn(tl.div_rn(m, bias_correction1) * lr, denom)

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

    m_absmax = tl.maximum(tl.max(tl.abs(m), axis=1), 1e-12)
    x = tl.div_rn(m, m_absmax[:, None])
    y = tl.div_rn(2.0 * x, 1.0 + tl.abs(x))
    tl.store(mq_ptr + offs, tl.floor(y * 127.0 + 0.5).to(tl.int8), mask=mask)
    tl.store(ms_ptr + rows, m_absmax.to(tl.float16), mask=rmask)

    root = tl.sqrt_rn(v)
    v_absmax = tl.maximum(tl.max(root, axis=1), 1e-12)
    q = tl.floor(tl.div_rn(root, v_absmax[:, None]) * 255.0 + 0.5)
    tl.store(vq_ptr + offs, q.to(tl.uint8), mask=mask)
    tl.store(vs_ptr + rows, v_absmax.to(tl.float16), mask=rmask)


def flash_adamw_triton_(param: torch.Tensor, grad: torch.Tensor, correction, m_codes, m_scales,
                        v_codes, v_scales, s: AdamScalars) -> None:
    """In-place fused step; same arguments as flash_adamw_reference."""
    n = param.numel()
    if n == 0:
        return
    tensors = [param, grad, m_codes, v_codes] + ([correction] if correction is not None else [])
    for t in tensors:
        if not t.is_contiguous():
            raise ValueError(f"the fused FlashAdamW step needs contiguous tensors; got strides "
                             f"{t.stride()} for shape {tuple(t.shape)} (pass fused=False)")
    if m_scales.numel() != num_groups(n) or v_scales.numel() != num_groups(n):
        raise ValueError(f"{n} elements need {num_groups(n)} scales per state, got "
                         f"{m_scales.numel()} and {v_scales.numel()}")
    grid = (triton.cdiv(num_groups(n), ROWS),)
    _flash_adamw_kernel[grid](
        param, grad, correction if correction is not None else m_codes, m_codes, m_scales,
        v_codes, v_scales, decode_tables(param.device), n, s.lr, s.beta1, s.beta2,
        s.one_minus_beta1, s.one_minus_beta2, s.eps, s.decay, s.bias_correction1,
        s.bias_correction2, HAS_CORRECTION=correction is not None, ROWS=ROWS, GROUP=GROUP,
        num_warps=4, enable_fp_fusion=False)
