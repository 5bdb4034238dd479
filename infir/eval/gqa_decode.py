"""SDPA attention for transformers models that decodes grouped-query heads without copying the KV cache.

Why our own: with an attention mask (left-padded rows, a static cache's unwritten positions), transformers'
SDPA path on CUDA expands K and V to one copy per query head (`repeat_kv`) before the kernel, as the fused
kernels take no grouped heads beside a mask. For Qwen2.5-0.5B's 14 query and 2 KV heads that writes seven copies
of every layer's whole cache at every decode step, which the kernel then reads, where the step needs the cache
read once. For one query position the copies are not needed: the group's query heads become the query positions of
their KV head, [batch, kv heads, group, dim], and one mask row serves them all. transformers does this itself
(`pack_gqa`) only outside torch.compile, where infir's decoder never runs. Every other call (prompts, models
without grouped heads, per-head masks) goes to transformers' own SDPA attention.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "infir_gqa_decode"


def gqa_decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers' attention-function signature: query [b, heads, q, d], key and value [b, kv heads, kv len, d];
    returns ([b, q, heads, d], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    per_head_mask = attention_mask is not None and attention_mask.shape[1] != 1
    if query.shape[2] != 1 or groups == 1 or per_head_mask or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    batch, heads, _, dim = query.shape
    packed = query.reshape(batch, heads // groups, groups, dim)  # the group's heads as the KV head's query positions
    out = F.scaled_dot_product_attention(packed, key, value, attn_mask=attention_mask,
                                         dropout_p=dropout, scale=scaling)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def use_gqa_decode(model) -> None:
    """Switch a transformers model whose attention is SDPA to gqa_decode_attention (the same masks as SDPA's).
    A transformers without registrable attention and masks keeps the model's own path."""
    try:
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask
    except ImportError:
        return
    if model.config._attn_implementation != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return
    AttentionInterface.register(NAME, gqa_decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
