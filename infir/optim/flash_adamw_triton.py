"""Fused FlashAdamW step: one pass over weight, correction, gradient and the two 8-bit states.

Twin of flash_adamw.flash_adamw_reference, bit for bit: true division and square root
(``div_rn``/``sqrt_rn``), no fused multiply-add (``enable_fp_fusion=False``), powers of two built
from bits. Memory-bound: ~12 bytes per parameter move (bf16 weight and grad in and out, three
int8 tensors in and out, 1/8 byte of scales), against 28 for fused fp32 AdamW.
"""
import torch
import triton
import triton.language as tl

from infir.optim.adam_math import AdamScalars
from infir.optim.companding import GROUP, num_groups
from infir.optim.triton_bits import bf16_half_ulp_log2, bf16_round_nearest, pow2

BLOCK = 1024


@triton.jit
def _flash_adamw_kernel(p_ptr, g_ptr, corr_ptr, mq_ptr, ms_ptr, vq_ptr, vs_ptr, n,
                        lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, decay,
                        bias_correction1, bias_correction2,
                        HAS_CORRECTION: tl.constexpr, BLOCK: tl.constexpr,
                        GROUP: tl.constexpr):
    N_GROUPS: tl.constexpr = BLOCK // GROUP
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    goffs = pid * N_GROUPS + tl.arange(0, N_GROUPS)
    gmask = goffs < (n + GROUP - 1) // GROUP

    # decode: master weight (Algorithm 1), momentum (softsign, Alg. 2), variance (sqrt, Alg. 3)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    narrow = tl.load(p_ptr + offs, mask=mask, other=0.0)
    master = narrow.to(tl.float32)
    if HAS_CORRECTION:
        corr = tl.load(corr_ptr + offs, mask=mask, other=0).to(tl.float32)
        k = bf16_half_ulp_log2(narrow)
        half = k >> 1  # arithmetic shift: floor(k / 2)
        master = master + tl.div_rn(corr, 127.0) * pow2(half) * pow2(k - half)
    y = tl.div_rn(tl.load(mq_ptr + offs, mask=mask, other=0).to(tl.float32), 127.0)
    m_scale = tl.load(ms_ptr + goffs, mask=gmask, other=0.0).to(tl.float32)
    m = tl.reshape(tl.reshape(tl.div_rn(y, 2.0 - tl.abs(y)), (N_GROUPS, GROUP)) * m_scale[:, None],
                   (BLOCK,))
    v_scale = tl.load(vs_ptr + goffs, mask=gmask, other=0.0).to(tl.float32)
    root = tl.div_rn(tl.load(vq_ptr + offs, mask=mask, other=0).to(tl.float32), 255.0)
    root = tl.reshape(tl.reshape(root, (N_GROUPS, GROUP)) * v_scale[:, None], (BLOCK,))
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

    mg = tl.reshape(m, (N_GROUPS, GROUP))
    m_absmax = tl.maximum(tl.max(tl.abs(mg), axis=1), 1e-12)
    x = tl.div_rn(mg, m_absmax[:, None])
    y = tl.div_rn(2.0 * x, 1.0 + tl.abs(x))
    tl.store(mq_ptr + offs, tl.reshape(tl.floor(y * 127.0 + 0.5), (BLOCK,)).to(tl.int8), mask=mask)
    tl.store(ms_ptr + goffs, m_absmax.to(tl.float16), mask=gmask)

    vg = tl.reshape(tl.sqrt_rn(v), (N_GROUPS, GROUP))
    v_absmax = tl.maximum(tl.max(vg, axis=1), 1e-12)
    q = tl.floor(tl.div_rn(vg, v_absmax[:, None]) * 255.0 + 0.5)
    tl.store(vq_ptr + offs, tl.reshape(q, (BLOCK,)).to(tl.uint8), mask=mask)
    tl.store(vs_ptr + goffs, v_absmax.to(tl.float16), mask=gmask)


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
    grid = (triton.cdiv(n, BLOCK),)
    _flash_adamw_kernel[grid](
        param, grad, correction if correction is not None else m_codes, m_codes, m_scales,
        v_codes, v_scales, n, s.lr, s.beta1, s.beta2, s.one_minus_beta1, s.one_minus_beta2,
        s.eps, s.decay, s.bias_correction1, s.bias_correction2,
        HAS_CORRECTION=correction is not None, BLOCK=BLOCK, GROUP=GROUP,
        num_warps=4, enable_fp_fusion=False)
