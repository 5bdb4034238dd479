"""Core attention through `torch.nn.functional.scaled_dot_product_attention`.

Why not megatron's local `DotProductAttention`: it materialises the [b, h, s, s] score matrix (too slow
and too large at 4k-32k context), builds its causal mask with device="cuda" (so it cannot run on CPU),
and Transformer Engine's fused attention cannot be assumed. SDPA picks FlashAttention-2 on Hopper for
the causal case and the memory-efficient kernel when a mask is given (packed SFT), and runs on CPU.

The module keeps megatron's core-attention interface ([s, b, heads, dim] in, [s, b, hidden] out), so
it slots into `SelfAttentionSubmodules.core_attention` of an unmodified megatron-core.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide


class SDPAttention(MegatronModule):
    """Causal (optionally block-diagonal) multi-/grouped-query attention via SDPA."""

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
    ):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SDPAttention does not implement context parallelism; set parallel.cp=1")
        tp = config.tensor_model_parallel_size
        self.heads = divide(config.num_attention_heads, tp)
        self.groups = divide(config.num_query_groups, tp)
        self.head_dim = config.kv_channels
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(self.head_dim)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.attn_mask_type = attn_mask_type

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
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError(
                "SDPAttention takes packed samples as a block-diagonal attention_mask "
                "(built from segment_ids by infir.train.batch), not packed_seq_params/attention_bias"
            )
        sq, b = query.shape[0], query.shape[1]
        # [s, b, h, d] -> [b, h, s, d]: SDPA's layout.
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        if attention_mask is None:
            mask, causal = None, True
        else:
            # Megatron masks mark positions to *drop* (True = masked out); SDPA wants True = attend.
            mask, causal = ~attention_mask, False
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=causal,
            scale=self.softmax_scale,
            enable_gqa=self.heads != self.groups,
        )
        # [b, h, s, d] -> [s, b, h*d]
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.heads * self.head_dim)
