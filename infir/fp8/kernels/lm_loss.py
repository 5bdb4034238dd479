"""Triton kernels of the chunked LM loss (infir/model/lm_loss.py): one chunk's softmax statistics and
its logit gradient, written in place.

The same two steps as their references, lm_loss_reference.chunk_stats_torch / chunk_grad_torch,
reading the chunk's logits in their own dtype: an online max / sum-exp pass (one read), then the
gradient written in place (one read, one write), instead of PyTorch's FP32 copy and its several passes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _stats_kernel(z_ptr, stride, target_ptr, m_ptr, s_ptr, tgt_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = z_ptr + row * stride
    # Per-lane running max and sum; a finite start value keeps exp(m_old - m_new) free of inf - inf.
    m_vec = tl.full([BLOCK], -1e30, tl.float32)
    s_vec = tl.zeros([BLOCK], tl.float32)
    for off in range(0, V, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        z = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m_vec, z)
        s_vec = s_vec * tl.exp(m_vec - m_new) + tl.exp(z - m_new)
        m_vec = m_new
    m = tl.max(m_vec, 0)
    s = tl.sum(s_vec * tl.exp(m_vec - m), 0)
    t = tl.load(target_ptr + row)
    owned = (t >= 0) & (t < V)
    z_t = tl.load(base + tl.where(owned, t, 0)).to(tl.float32)
    tl.store(m_ptr + row, m)
    tl.store(s_ptr + row, s)
    tl.store(tgt_ptr + row, tl.where(owned, z_t, 0.0))


@triton.jit
def _grad_kernel(z_ptr, stride, target_ptr, m_ptr, s_ptr, w_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ptrs = z_ptr + row * stride + cols
    z = tl.load(ptrs, mask=cols < V, other=0.0).to(tl.float32)
    p = tl.exp(z - tl.load(m_ptr + row)) / tl.load(s_ptr + row)
    g = tl.where(cols == tl.load(target_ptr + row), p - 1.0, p) * tl.load(w_ptr + row)
    tl.store(ptrs, g.to(z_ptr.dtype.element_ty), mask=cols < V)


def chunk_stats_triton(logits: torch.Tensor, target: torch.Tensor, block: int = BLOCK):
    """Row max m, sum of exp(z - m), and the target logit (0 where the target is not on this shard)."""
    n, v = logits.shape
    m, s, tgt = (torch.empty(n, dtype=torch.float32, device=logits.device) for _ in range(3))
    _stats_kernel[(n,)](logits, logits.stride(0), target.contiguous(), m, s, tgt, v, BLOCK=block, num_warps=8)
    return m, s, tgt


def chunk_grad_triton(logits: torch.Tensor, target: torch.Tensor, m: torch.Tensor, s: torch.Tensor, w: torch.Tensor,
                      block: int = BLOCK) -> None:
    """In place: logits <- w * (softmax(logits) - onehot(target)), the softmax from the global m, s."""
    n, v = logits.shape
    _grad_kernel[(n, triton.cdiv(v, block))](logits, logits.stride(0), target.contiguous(), m.contiguous(),
                                             s.contiguous(), w.contiguous(), v, BLOCK=block, num_warps=8)
