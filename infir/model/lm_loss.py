"""LM head + cross entropy, chunked over tokens, with the gradients computed during the forward pass.

The loss the trainer needs is a weighted sum over tokens, L = sum_t w_t * CE_t, with
CE_t = logsumexp_v(z_tv) - z_t,y_t and z = H W^T. Because L is a plain weighted sum, its gradient
with respect to the logits is known as soon as the softmax is: dL/dz_tv = w_t * (p_tv - [v == y_t]).
So each chunk of tokens is pushed through the LM head, its softmax statistics are taken (FP32), its
logits buffer is overwritten in place by dL/dz, and that is immediately multiplied back into
dH = dz W and dW += dz^T H (the FusedLinearCrossEntropy of Liger-Kernel). Only one chunk's logits ever
exist; backward merely scales the stored dH, dW by the incoming (scalar) gradient.

Tensor parallelism is megatron's vocab-parallel layout: each rank holds rows [r*V/tp, (r+1)*V/tp) of W;
the row max is all-reduced with MAX, the sum of exponentials (rescaled to the global max) and the
target logit (non-zero only on the rank that owns the label) with SUM. The input side is megatron's
column-parallel one (infir.model.linears.column_input): hidden states are replicated (dH all-reduced
in backward) or, with sequence parallelism, all-gathered (dH reduce-scattered).

Layouts follow megatron: hidden [s, b, h], labels and loss weights [b, s], per-token losses [b, s].
Labels outside the vocabulary (e.g. -100) have no target logit, exactly as megatron's
vocab_parallel_cross_entropy treats them; give them weight 0.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from infir.fp8.lm_loss_reference import chunk_grad_torch, chunk_stats_torch
from infir.model.main_grad import adds_into_main_grad

DEFAULT_CHUNK_TOKENS = 8192


class LMLoss(NamedTuple):
    loss: torch.Tensor  # scalar: sum_t w_t * CE_t, differentiable
    per_token: torch.Tensor  # [b, s] FP32 CE_t, detached (for logging)
    num_tokens: torch.Tensor  # scalar: sum_t w_t


# --------------------------------------------------------------------------- reference
def lm_loss_reference(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, loss_weight: torch.Tensor) -> LMLoss:
    """Single-rank twin: full logits, FP32 cross entropy, autograd. Labels must lie in [0, V)."""
    logits = (hidden @ weight.t()).float()  # [s, b, V]
    per_token = F.cross_entropy(logits.flatten(0, 1), labels.t().reshape(-1), reduction="none").view(labels.t().shape).t()
    loss = (per_token * loss_weight.float()).sum()
    return LMLoss(loss, per_token.detach(), loss_weight.float().sum())


def _chunk_ops(logits: torch.Tensor, use_triton: bool | None):
    """The per-chunk pair: the Triton kernels (infir/fp8/kernels/lm_loss.py, imported on first use so
    that a test choosing Triton's interpreter first runs them on the CPU) or their PyTorch twins."""
    if use_triton is None:
        use_triton = logits.is_cuda
    if use_triton:
        from infir.fp8.kernels.lm_loss import chunk_grad_triton, chunk_stats_triton

        return chunk_stats_triton, chunk_grad_triton
    return chunk_stats_torch, chunk_grad_torch


def _tp_reduce(m, s, tgt, tp_group):
    """Local (m, s, tgt) of one vocab shard -> global softmax statistics over all shards."""
    if tp_group is None or dist.get_world_size(tp_group) == 1:
        return m, s, tgt
    m_all = m.clone()
    dist.all_reduce(m_all, op=dist.ReduceOp.MAX, group=tp_group)
    s = s * torch.exp(m - m_all)
    st = torch.stack([s, tgt])
    dist.all_reduce(st, op=dist.ReduceOp.SUM, group=tp_group)
    return m_all, st[0], st[1]


# --------------------------------------------------------------------------- the fused function
class _ChunkedLMLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, loss_weight, chunk_tokens, compute_dtype, tp_group, use_triton, want_grad,
                into_main_grad):
        s_len, b, h = hidden.shape
        x = hidden.reshape(s_len * b, h).to(compute_dtype)
        wt = weight.to(compute_dtype)
        v_local = wt.shape[0]
        rank = dist.get_rank(tp_group) if tp_group is not None and dist.get_world_size(tp_group) > 1 else 0
        # Token t = i * b + j of the [s, b] flattening; labels/weights arrive as [b, s].
        target = labels.t().reshape(-1) - rank * v_local
        w = loss_weight.t().reshape(-1).float()
        # Under no_grad (validation) only the losses are computed.
        needs_grad = want_grad and (ctx.needs_input_grad[0] or ctx.needs_input_grad[1])

        ce = torch.empty(s_len * b, dtype=torch.float32, device=hidden.device)
        dx = torch.empty_like(x) if needs_grad else None
        dw = torch.zeros(v_local, h, dtype=torch.float32, device=hidden.device) if needs_grad and ctx.needs_input_grad[1] else None
        for start in range(0, x.shape[0], chunk_tokens):
            end = min(start + chunk_tokens, x.shape[0])
            xc, tc = x[start:end], target[start:end]
            logits = xc @ wt.t()  # [n, V/tp] in the compute dtype: the only logits that exist
            stats_fn, grad_fn = _chunk_ops(logits, use_triton)
            m, s, tgt = _tp_reduce(*stats_fn(logits, tc), tp_group)
            ce[start:end] = torch.log(s) + m - tgt
            if not needs_grad:
                continue
            grad_fn(logits, tc, m, s, w[start:end])  # logits now hold dL/dz
            dx[start:end] = logits @ wt
            if dw is not None:
                # The GEMM accumulates in FP32; the chunk's product is rounded once, as megatron's
                # own weight-gradient GEMM is, then summed across chunks in FP32 (add_ promotes
                # without an FP32 copy of the product).
                if logits.dtype == torch.float32:
                    dw.addmm_(logits.t(), xc)
                else:
                    dw.add_(logits.t() @ xc)
            del logits
        ctx.save_for_backward(dx, dw)
        ctx.shapes = (hidden.shape, hidden.dtype, weight.dtype)
        ctx.weight = weight if into_main_grad else None
        loss = (ce * w).sum()
        return loss, ce.view(s_len, b).t()

    @staticmethod
    def backward(ctx, grad_loss, _grad_per_token):
        dx, dw = ctx.saved_tensors
        shape, h_dtype, w_dtype = ctx.shapes
        # Scaled in place: a second [V/tp, h] FP32 buffer here would land on the step's memory peak.
        # (A second backward through the same forward then fails autograd's saved-tensor version check.)
        dh = dx.mul_(grad_loss.to(dx.dtype)).view(shape).to(h_dtype) if ctx.needs_input_grad[0] else None
        if not ctx.needs_input_grad[1]:
            return dh, None, *(None,) * 8
        if ctx.weight is not None:
            # Added into megatron's FP32 main_grad here, in one pass, while the rest of the backward runs. Returned,
            # it took a scaling pass and then DDP's hook's add, which for a tied weight waits for the lookup's
            # backward, the last of the step: a pass over the vocabulary x hidden table between the backward's
            # last GEMM and the embedding bucket's reduce-scatter, the one no overlap hides. The hook skips the
            # unwritten placeholder (`grad_added_to_main_grad`), as for infir's FP8 linears and the lookup.
            weight = ctx.weight
            weight.main_grad.addcmul_(dw, grad_loss.float())
            weight.grad_added_to_main_grad = True  # megatron's zero_grad_buffer clears it each step
            return dh, torch.empty_like(weight), *(None,) * 8
        # Returned in FP32 (autograd casts it to the parameter's dtype); megatron DDP's hook then adds
        # param.grad into param.main_grad.
        return dh, dw.mul_(grad_loss.float()).to(w_dtype), *(None,) * 8


def chunked_lm_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    loss_weight: torch.Tensor | None = None,
    *,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    tp_group=None,
    sequence_parallel: bool = False,
    use_triton: bool | None = None,
    into_main_grad: bool = False,
) -> LMLoss:
    """sum_t w_t * CE(H_t W^T, y_t) without materialising more than `chunk_tokens` rows of logits.

    hidden [s, b, h] (the local sequence shard under sequence parallelism), weight [V/tp, h], labels and
    loss_weight [b, s]. Under autocast the GEMMs run in the autocast dtype (as F.linear would), the
    softmax always in FP32. use_triton: None picks the Triton per-chunk kernels on CUDA. into_main_grad: where the
    weight has megatron DDP's FP32 main_grad, backward adds the weight's gradient there and hands autograd an
    unwritten placeholder, marking the weight `grad_added_to_main_grad` for DDP's hook to skip.
    """
    from infir.model.linears import column_input

    if chunk_tokens < 1:
        raise ValueError(f"loss_chunk_tokens={chunk_tokens} must be >= 1")
    if hidden.dim() != 3 or labels.dim() != 2:
        raise ValueError(f"expected hidden [s, b, h] and labels [b, s]; got {tuple(hidden.shape)} and {tuple(labels.shape)}")
    if loss_weight is None:
        loss_weight = torch.ones_like(labels, dtype=torch.float32)
    tp = dist.get_world_size(tp_group) if tp_group is not None and dist.is_initialized() else 1
    x = column_input(hidden, allreduce_dgrad=tp > 1 and not sequence_parallel, sequence_parallel=sequence_parallel and tp > 1, tp_group=tp_group)
    if (x.shape[0], x.shape[1]) != (labels.shape[1], labels.shape[0]):
        raise ValueError(f"hidden covers [s={x.shape[0]}, b={x.shape[1]}] tokens but labels are [b, s]={tuple(labels.shape)}")
    device_type = x.device.type
    compute_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype
    with torch.autocast(device_type, enabled=False):
        loss, per_token = _ChunkedLMLoss.apply(
            x, weight, labels, loss_weight, chunk_tokens, compute_dtype, tp_group if tp > 1 else None, use_triton,
            torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad),
            into_main_grad and adds_into_main_grad(weight),
        )
    return LMLoss(loss, per_token.detach(), loss_weight.float().sum())
