"""Core attention: torch's kernels behind megatron's core-attention interface.

Why not megatron's local `DotProductAttention`: it materialises the [b, h, s, s] score matrix (too slow
and too large at 4k-32k context), builds its causal mask with device="cuda" (so it cannot run on CPU),
and Transformer Engine's fused attention cannot be assumed.

Which kernel, by measurement on the H100 (bench/attention.py, fwd+bwd of one layer, Qwen2.5 heads):
- plain causal rows: SDPA with `is_causal`, which picks cuDNN's fused kernel there (faster than flash at
  these shapes);
- packed documents or context parallelism (a `DocumentLayout` arrives as `packed_seq_params`):
  `kernel="varlen"`, FlashAttention's variable-length kernel (`torch.nn.attention.varlen`), or
  `kernel="flex"`, FlexAttention with a document block mask (built once per micro-batch);
  `kernel="auto"` picks by row length (FLEX_FROM_TOKENS), as measured; `kernel="sdpa"` the
  dense-mask reference, which is also what runs on CPU (the other two are CUDA's).

Under context parallelism the keys and values are all-gathered over the group (megatron's sequence
gather: its backward reduce-scatters their gradients). Qwen2.5 has 2-4 KV heads, so the gather moves
a sixth to a seventh of what gathering queries would.

The module keeps megatron's core-attention interface ([s, b, heads, dim] in, [s, b, hidden] out), so
it slots into `SelfAttentionSubmodules.core_attention` of an unmodified megatron-core.
"""
from __future__ import annotations

import functools
import inspect
import math
from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide

from infir.model.documents import DocumentLayout, document_ids, gathered_order, reference_mask

KERNELS = ("auto", "varlen", "flex", "sdpa")


# From this row length on, `auto` runs FlexAttention: bench/attention.py's document rows (1.5B and 7B heads)
# have it ahead of varlen at 32k and behind it at 8k; the crossover lies between.
FLEX_FROM_TOKENS = 16384


def resolve_kernel(kernel: str, device: torch.device, row_tokens: int = 0, dtype: torch.dtype = torch.bfloat16) -> str:
    """`auto`: on CUDA varlen, or flex for rows of FLEX_FROM_TOKENS or more and for FP32 (FlashAttention
    takes 16-bit inputs only); the SDPA reference elsewhere."""
    half = dtype in (torch.bfloat16, torch.float16)
    if kernel == "auto":
        if device.type != "cuda":
            return "sdpa"
        return "flex" if row_tokens >= FLEX_FROM_TOKENS or not half else "varlen"
    if kernel == "varlen" and not half:
        raise ValueError(f"model.attention=varlen takes bf16/fp16 inputs, got {dtype}; use model.attention=flex or auto")
    if kernel != "sdpa" and device.type != "cuda":
        raise ValueError(f"model.attention={kernel} runs on CUDA only; use model.attention=sdpa (or auto) on {device.type}")
    return kernel


class CoreAttention(MegatronModule):
    """Causal multi-/grouped-query attention, within documents, optionally context-parallel."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        cp_comm_type: Optional[str] = None,
        pg_collection=None,
        kernel: str = "auto",
    ):
        super().__init__(config=config)
        tp = config.tensor_model_parallel_size
        self.heads = divide(config.num_attention_heads, tp)
        self.groups = divide(config.num_query_groups, tp)
        self.head_dim = config.kv_channels
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(self.head_dim)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.attn_mask_type = attn_mask_type
        if kernel not in KERNELS:
            raise ValueError(f"model.attention={kernel!r}; valid: {', '.join(KERNELS)}")
        self.kernel = kernel
        self.cp_group = getattr(pg_collection, "cp", None) if pg_collection is not None else None

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        attn_mask_type: Optional[AttnMaskType] = None,
        attention_bias: Optional[torch.Tensor] = None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        if attention_mask is not None or attention_bias is not None:
            raise NotImplementedError("infir's attention takes packed documents as a DocumentLayout (packed_seq_params), not a mask or bias")
        sq, b = query.shape[0], query.shape[1]
        if packed_seq_params is None:
            out = self._sdpa(query, key, value, None)
        else:
            out = self._documents(query, key, value, packed_seq_params)
        return out.reshape(sq, b, self.heads * self.head_dim)

    def _sdpa(self, query, key, value, mask):
        """SDPA over [s, b, h, d] tensors: causal without a mask; returns [s_q, b, h, d]."""
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=mask is None,
            scale=self.softmax_scale, enable_gqa=self.heads != self.groups,
        )
        return out.permute(2, 0, 1, 3)

    # The document kernels run outside torch.compile's graph: their boundaries (count of segments,
    # longest segment) change with every micro-batch, which would recompile the layer, or record a
    # new CUDA graph, each time; the kernel itself is one opaque call either way.
    @torch.compiler.disable
    def _documents(self, query, key, value, layout: DocumentLayout):
        if layout.cp > 1:
            group = self.cp_group or parallel_state.get_context_parallel_group()
            key, value = (gather_from_sequence_parallel_region(t, True, group=group) for t in (key, value))
        return self.attend_documents(query, key, value, layout)

    def attend_documents(self, query, key, value, layout: DocumentLayout):
        """query: this rank's [s, b, h, d]; key, value: the whole sequence's [S, b, groups, d] (under
        CP, every rank's tokens in rank order, as the all-gather leaves them). Returns [s, b, h, d]."""
        kernel = resolve_kernel(self.kernel, query.device, layout.positions.shape[1], query.dtype)
        if kernel != "sdpa" and self.training and self.dropout:
            raise ValueError(f"model.attention={kernel} has no attention dropout; use model.attention=sdpa")
        if kernel == "varlen":
            return self._varlen(query, key, value, layout)
        key, value = (in_sequence_order(t, layout) for t in (key, value))
        if kernel == "flex":
            return self._flex(query, key, value, layout)
        return self._sdpa(query, key, value, reference_mask(layout))

    def _varlen(self, query, key, value, layout: DocumentLayout):
        from torch.nn.attention.varlen import varlen_attn

        sq, b = query.shape[:2]
        q, k, v = (t.transpose(0, 1).reshape(-1, *t.shape[2:]) for t in (query, key, value))
        if layout.key_index is not None:
            k, v = k[layout.key_index], v[layout.key_index]
        # FlashAttention shares KV heads natively; newer torch asks for it by name.
        out = varlen_attn(
            q, k, v, layout.cu_seqlens_q, layout.cu_seqlens_kv, layout.max_seqlen_q, layout.max_seqlen_kv,
            scale=self.softmax_scale, window_size=(-1, 0), **({"enable_gqa": True} if _varlen_names_gqa() else {}),
        )
        return out.reshape(b, sq, self.heads, self.head_dim).transpose(0, 1)

    def _flex(self, query, key, value, layout: DocumentLayout):
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        out = _flex_attention()(q, k, v, block_mask=flex_block_mask(layout, q.shape[2]), scale=self.softmax_scale,
                                enable_gqa=self.heads != self.groups)
        return out.permute(2, 0, 1, 3)


def in_sequence_order(t: torch.Tensor, layout: DocumentLayout) -> torch.Tensor:
    """Keys gathered over the CP group ([S, b, ...] in rank order) put back in sequence order."""
    if layout.cp == 1:
        return t
    where = torch.as_tensor(gathered_order(t.shape[0], layout.cp), device=t.device)
    return t.index_select(0, where)


def flex_block_mask(layout: DocumentLayout, q_len: int):
    """FlexAttention's block mask of the layout (built once per micro-batch, shared by every layer)."""
    if layout.flex_mask is None:
        from torch.nn.attention.flex_attention import create_block_mask

        doc = document_ids(layout.positions)
        if layout.cp == 1:
            def same_document_causal(b, h, qi, ki):
                return (doc[b, qi] == doc[b, ki]) & (ki <= qi)
        else:
            q_t = layout.local_positions  # a query's place in the whole sequence: one more load per element

            def same_document_causal(b, h, qi, ki):
                return (doc[b, q_t[qi]] == doc[b, ki]) & (ki <= q_t[qi])

        # compiled: the eager build evaluates the mask element by element and costs a sizeable part of a layer
        layout.flex_mask = create_block_mask(same_document_causal, doc.shape[0], None, q_len, doc.shape[1],
                                             device=doc.device, _compile=True)
    return layout.flex_mask


@functools.cache
def _flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)  # flex's fused kernel exists only compiled


@functools.cache
def _varlen_names_gqa() -> bool:
    from torch.nn.attention.varlen import varlen_attn

    return "enable_gqa" in inspect.signature(varlen_attn).parameters
