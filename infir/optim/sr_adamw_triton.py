"""Fused SR-AdamW step on bf16 weight and states: read 8 bytes, write 6, per parameter.

Twin of sr_adamw.sr_adamw_reference given the same noise. The noise is Philox
(``tl.randint4x``) keyed by (seed, element index in the whole parameter: a shard starting at
element ``offset`` draws the whole's numbers there); ``sr_noise_triton`` writes the same numbers
to a tensor so tests can feed them to the twin."""
from typing import Optional

import torch
import triton
import triton.language as tl

from infir.optim.adam_math import AdamScalars
from infir.optim.triton_bits import bf16_round_nearest, bf16_round_stochastic

BLOCK = 1024


@triton.jit
def _noise(seed, offs):
    r0, r1, r2, _ = tl.randint4x(seed, offs)
    return r0 & 0xFFFF, r1 & 0xFFFF, r2 & 0xFFFF


@triton.jit
def _sr_adamw_kernel(p_ptr, g_ptr, m_ptr, v_ptr, n, lr, beta1, beta2, one_minus_beta1,
                     one_minus_beta2, eps, decay, bias_correction1, bias_correction2, seed,
                     offset, STOCHASTIC: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    m = m * beta1 + g * one_minus_beta1
    v = v * beta2 + g * g * one_minus_beta2
    p = p * decay
    denom = tl.sqrt_rn(tl.div_rn(v, bias_correction2)) + eps
    p = p - tl.div_rn(tl.div_rn(m, bias_correction1) * lr, denom)
    if STOCHASTIC:
        n_p, n_m, n_v = _noise(seed, offs + offset)
        tl.store(p_ptr + offs, bf16_round_stochastic(p, n_p), mask=mask)
        tl.store(m_ptr + offs, bf16_round_stochastic(m, n_m), mask=mask)
        tl.store(v_ptr + offs, bf16_round_stochastic(v, n_v), mask=mask)
    else:
        tl.store(p_ptr + offs, bf16_round_nearest(p), mask=mask)
        tl.store(m_ptr + offs, bf16_round_nearest(m), mask=mask)
        tl.store(v_ptr + offs, bf16_round_nearest(v), mask=mask)


@triton.jit
def _noise_kernel(out_ptr, n, seed, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    n_p, n_m, n_v = _noise(seed, offs)
    tl.store(out_ptr + offs, n_p.to(tl.int32), mask=mask)
    tl.store(out_ptr + n + offs, n_m.to(tl.int32), mask=mask)
    tl.store(out_ptr + 2 * n + offs, n_v.to(tl.int32), mask=mask)


def _check(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if not t.is_contiguous():
            raise ValueError(f"the fused SR-AdamW step needs contiguous tensors; got strides "
                             f"{t.stride()} for shape {tuple(t.shape)} (pass fused=False)")


def sr_adamw_triton_(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                     exp_avg_sq: torch.Tensor, s: AdamScalars, seed: Optional[int], offset: int = 0) -> None:
    """In-place fused step; ``seed=None`` rounds to nearest (the BF16AdamW baseline). ``offset``:
    the first element's index in the whole parameter when ``param`` is a shard of it."""
    n = param.numel()
    if n == 0:
        return
    _check(param, grad, exp_avg, exp_avg_sq)
    _sr_adamw_kernel[(triton.cdiv(n, BLOCK),)](
        param, grad, exp_avg, exp_avg_sq, n, s.lr, s.beta1, s.beta2, s.one_minus_beta1,
        s.one_minus_beta2, s.eps, s.decay, s.bias_correction1, s.bias_correction2,
        0 if seed is None else seed, offset, STOCHASTIC=seed is not None, BLOCK=BLOCK, num_warps=4,
        enable_fp_fusion=False)


def sr_noise_triton(shape, seed: int, device) -> torch.Tensor:
    """The kernel's noise for a parameter of ``shape``: int32 (3, *shape) as sr_adamw.sr_noise."""
    numel = int(torch.Size(shape).numel())
    out = torch.empty((3, *shape), dtype=torch.int32, device=device)
    if numel:
        _noise_kernel[(triton.cdiv(numel, BLOCK),)](out, numel, seed, BLOCK=BLOCK)
    return out
