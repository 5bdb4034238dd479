"""megatron's GPTModel with the LM head and loss fused and chunked over tokens (infir.model.lm_loss).

Contract with the trainer, when `chunked_loss` is on, the model is training-or-evaluating (not
inference) and `labels` are given:

    loss_sum = model(input_ids, position_ids, attention_mask, labels=labels, loss_mask=loss_mask)

returns the scalar sum_t loss_mask[t] * CE_t (FP32, differentiable) — what the trainer computes as
`(per_token.float() * loss_mask).sum()` without it — and never builds the [s, b, V/tp] logits. The detached
per-token losses [b, s] of the last call stay on `model.last_per_token_loss` for logging. With
`loss_mask=None` every token has weight 1. Every other call (no labels, inference, chunked_loss off,
multi-token prediction) is megatron's own `_postprocess`, so it returns per-token losses [b, s] or
logits exactly as GPTModel does.

RoPE reads `position_ids` (megatron's rotary embedding reads only the sequence length): positions
restart at each packed document, as the model sees them at evaluation, and under context parallelism
each rank's tokens carry their own positions.
"""
from __future__ import annotations

from megatron.core.models.gpt import GPTModel

from infir.model.embedding import MainGradEmbedding
from infir.model.lm_loss import DEFAULT_CHUNK_TOKENS, chunked_lm_loss


class InfirGPTModel(GPTModel):
    """GPTModel (same constructor) plus `chunked_loss` / `loss_chunk_tokens`, settable after construction."""

    chunked_loss: bool = False
    loss_chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    last_per_token_loss = None

    def _preprocess(self, input_ids, position_ids, *args, **kwargs):
        out = super()._preprocess(input_ids, position_ids, *args, **kwargs)
        own_positions = (
            position_ids is not None and out[1] is not None and kwargs.get("inference_context") is None
            and kwargs.get("decoder_input") is None and self.position_embedding_type == "rope"
        )
        if not own_positions:
            return out
        # [max_len, 1, 1, dim] (cached by megatron; packed_seq: no context-parallel slicing) -> [s, b, 1, dim]
        table = self.rotary_pos_emb(self.max_sequence_length, packed_seq=True)
        return (out[0], table[position_ids.t()].squeeze(2), *out[2:])

    def _postprocess(self, hidden_states, input_ids, position_ids, labels, *args, loss_mask=None, inference_context=None, **kwargs):
        chunked = (
            self.chunked_loss
            and self.post_process
            and labels is not None
            and inference_context is None
            and kwargs.get("inference_params") is None
            and self.config.mtp_num_layers is None
        )
        if not chunked:
            return super()._postprocess(
                hidden_states, input_ids, position_ids, labels, *args, loss_mask=loss_mask, inference_context=inference_context, **kwargs
            )
        head = self.output_layer
        weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else head.weight
        if head.bias is not None:
            raise ValueError("chunked_loss supports a bias-free LM head only (Qwen2.5 has none); set model.chunked_loss=false")
        # a tied weight's gradient goes into main_grad only where the lookup's does too: DDP's hook adds what
        # autograd sums only where neither layer did (embedding.py)
        lookup = self.embedding.word_embeddings if self.share_embeddings_and_output_weights else None
        out = chunked_lm_loss(
            hidden_states,
            weight,
            labels,
            loss_mask,
            chunk_tokens=self.loss_chunk_tokens,
            tp_group=head.tp_group,
            sequence_parallel=head.sequence_parallel,
            into_main_grad=lookup is None or (isinstance(lookup, MainGradEmbedding) and lookup.adds_rows_into_main_grad()),
        )
        self.last_per_token_loss = out.per_token
        return out.loss
