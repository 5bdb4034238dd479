"""The Qwen2.5 family as megatron-core `TransformerConfig`s, and the GPTModel built from them.

One size table (`SIZES`): the published Qwen2.5 shapes, and `tiny` for tests and the demo, which runs
the same code path as 7B. The architecture is Qwen2's: grouped-query attention with bias on Q/K/V
only, RMSNorm (eps 1e-6), SwiGLU MLP, RoPE with theta 1e6, embeddings tied to the LM head for
0.5B/1.5B/3B and untied for 7B.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class QwenSize:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied: bool
    max_positions: int = 32768
    rope_theta: float = 1_000_000.0
    norm_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def num_params(self) -> int:
        """Parameter count (embedding and, if untied, LM head included)."""
        d, kv = self.hidden, self.kv_heads * self.head_dim
        attn = d * (d + 2 * kv) + (d + 2 * kv) + d * d
        mlp = 3 * d * self.ffn
        per_layer = attn + mlp + 2 * d
        emb = self.vocab * d * (1 if self.tied else 2)
        return self.layers * per_layer + emb + d


SIZES: dict[str, QwenSize] = {
    # 4 layers, GQA 4:2, vocab of the demo BPE tokenizer: ~1.6M params, small enough to train on CPU.
    "tiny": QwenSize(hidden=128, layers=4, heads=4, kv_heads=2, ffn=352, vocab=8192, tied=True, max_positions=2048),
    # Qwen2.5-0.5B's layer shape at half its depth, on the demo vocabulary: ~180M params, for loss-parity runs.
    "small-180m": QwenSize(hidden=896, layers=12, heads=14, kv_heads=2, ffn=4864, vocab=8192, tied=True, max_positions=4096),
    "qwen2.5-0.5b": QwenSize(hidden=896, layers=24, heads=14, kv_heads=2, ffn=4864, vocab=151936, tied=True),
    "qwen2.5-1.5b": QwenSize(hidden=1536, layers=28, heads=12, kv_heads=2, ffn=8960, vocab=151936, tied=True),
    "qwen2.5-3b": QwenSize(hidden=2048, layers=36, heads=16, kv_heads=2, ffn=11008, vocab=151936, tied=True),
    "qwen2.5-7b": QwenSize(hidden=3584, layers=28, heads=28, kv_heads=4, ffn=18944, vocab=152064, tied=False),
}


def get_size(name: str, **overrides) -> QwenSize:
    if name not in SIZES:
        raise KeyError(f"model.name={name!r} is not a known size; valid: {sorted(SIZES)}")
    return replace(SIZES[name], **overrides) if overrides else SIZES[name]


def check_parallel(size: QwenSize, tp: int, seq_length: int, sequence_parallel: bool = False, cp: int = 1) -> None:
    """Fail before training, naming the key, when the model cannot be split as asked. Context
    parallelism all-gathers keys and values, so it puts no condition on the heads; it cuts the
    sequence in 2 x cp chunks."""
    if tp < 1:
        raise ValueError(f"parallel.tp={tp} must be >= 1")
    for what, n in (("model.heads", size.heads), ("model.kv_heads", size.kv_heads), ("model.ffn", size.ffn)):
        if n % tp:
            valid = [t for t in range(1, n + 1) if size.heads % t == 0 and size.kv_heads % t == 0 and size.ffn % t == 0]
            raise ValueError(f"parallel.tp={tp} does not divide {what}={n}; valid tp values for this model: {valid}")
    if size.vocab % tp:
        raise ValueError(f"parallel.tp={tp} does not divide model.vocab={size.vocab}")
    if seq_length > size.max_positions:
        raise ValueError(f"data.seq_length={seq_length} exceeds the model's max_positions={size.max_positions}")
    if cp < 1:
        raise ValueError(f"parallel.cp={cp} must be >= 1")
    if cp > 1 and seq_length % (2 * cp):
        valid = [c for c in range(2, 17) if seq_length % (2 * c) == 0]
        raise ValueError(f"stage.seq_length={seq_length} must be divisible by 2 x parallel.cp={2 * cp} (each rank holds "
                         f"two of 2 x cp chunks); valid cp values for this length: {valid}")
    if sequence_parallel and (seq_length // cp) % tp:
        raise ValueError(f"stage.seq_length / parallel.cp = {seq_length // cp} must be divisible by parallel.tp={tp} "
                         f"with sequence parallelism")


def transformer_config(
    size: QwenSize,
    *,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
    tp_comm_overlap: bool = False,
    params_dtype: torch.dtype = torch.float32,
    init_std: float = 0.02,
    recompute: str | None = None,
    cpu_init: bool = True,
    fusions: bool = False,
    autocast_dtype: torch.dtype | None = None,
):
    """A megatron TransformerConfig for `size`.

    `cpu_init` initialises every weight whole on the CPU from one RNG stream and then splits it across
    tensor-parallel ranks, so TP=1 and TP=2 start from identical weights (megatron's GPU init draws
    per-rank streams). `tp_comm_overlap`: the sequence-parallel collectives split per rank around their
    GEMMs (infir.model.linears). `recompute`: None, "selective" (attention core) or "full" (whole layers).
    `fusions` turns on megatron's own torch.compile-fused SwiGLU, bias-dropout-add and vocab-parallel
    cross entropy (GPU; on CPU their compile time outweighs a tiny model's step). `autocast_dtype`: the
    dtype the trainer autocasts to (None: no autocast); each layer enters it too (spec.AutocastLayer).
    """
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=size.layers,
        hidden_size=size.hidden,
        num_attention_heads=size.heads,
        num_query_groups=size.kv_heads,
        kv_channels=size.head_dim,
        ffn_hidden_size=size.ffn,
        normalization="RMSNorm",
        layernorm_epsilon=size.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=init_std,
        tensor_model_parallel_size=tp,
        context_parallel_size=cp,
        sequence_parallel=sequence_parallel and tp > 1,
        # megatron's field (otherwise read by Transformer Engine's layers only): infir's linears split the
        # sequence-parallel collectives around their GEMMs (infir.model.linears)
        tp_comm_overlap=tp_comm_overlap and sequence_parallel and tp > 1,
        params_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        use_cpu_initialization=cpu_init,
        **_fusion_kwargs(fusions),
        enable_autocast=autocast_dtype is not None,
        autocast_dtype=autocast_dtype,
        # megatron-core 0.16's default ("full") warns that it is deprecated in favour of [], the same
        # scope (the whole layer); infir takes its CUDA graphs through torch.compile, not this setting
        cuda_graph_scope=[],
        **_recompute_kwargs(recompute),
    )


def _recompute_kwargs(recompute: str | None) -> dict:
    """TransformerConfig's activation-recompute settings for model.recompute."""
    if recompute == "selective":
        return dict(recompute_granularity="selective", recompute_modules=["core_attn"])
    if recompute == "full":
        return dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    if recompute not in (None, "none"):
        raise ValueError(f"model.recompute={recompute!r}; valid: none, selective, full")
    return {}


def _fusion_kwargs(fusions: bool) -> dict:
    """TransformerConfig's kernel-fusion settings: megatron's torch.compile-fused ones as asked."""
    return dict(
        bias_activation_fusion=fusions,
        bias_dropout_fusion=fusions,
        cross_entropy_loss_fusion=fusions,
        cross_entropy_fusion_impl="native",
        # These need apex / Transformer Engine kernels, which infir does not assume.
        gradient_accumulation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
    )


def build_gpt(size: QwenSize, config, recipe=None, *, seq_length: int, chunked_loss: bool = False,
              loss_chunk_tokens: int = 8192, attention: str = "auto", transient_fp8_weights: bool = False):
    """megatron GPTModel for one pipeline stage holding the whole depth (pre- and post-process).

    chunked_loss: the LM head + cross entropy run chunk by chunk with gradients computed in the forward
    (infir/model/lm_loss.py); the model then returns the loss_mask-weighted sum, never full logits.
    recipe: the infir.fp8.Recipe the projections run (None or a high-precision recipe: megatron's linears).
    attention: the kernel of packed documents and context parallelism (infir.model.attention.KERNELS).
    transient_fp8_weights: each layer quantizes its FP8 weights per forward and drops them after it
    (fp8_linears.quantize_weights_per_layer) instead of keeping them from one optimizer step to the next.
    """
    from infir.model.spec import block_spec, projections

    proj = projections(recipe)
    if proj.activation is not None:
        # megatron applies a spec'd activation module only under this flag, and refuses it together
        # with its own fused bias-SwiGLU (the module replaces that one).
        config.use_te_activation_func, config.bias_activation_fusion = True, False
    from infir.model import cpu_shims
    from infir.model.gpt import InfirGPTModel
    cpu_shims.install()
    model = InfirGPTModel(
        config=config,
        transformer_layer_spec=block_spec(size.layers, proj, attention),
        vocab_size=size.vocab,
        max_sequence_length=max(seq_length, 1),
        pre_process=True,
        post_process=True,
        share_embeddings_and_output_weights=size.tied,
        position_embedding_type="rope",
        rotary_base=int(size.rope_theta),
        rotary_percent=1.0,
        parallel_output=True,
    )
    # GPTModel builds its LM head from megatron's own ColumnParallelLinear, outside the layer spec.
    # Same parameters and sharding, our matmul path (autocast on CPU, torch.compile-friendly); the LM
    # head stays high precision under every recipe, as InfiR2 and LLMQ keep it.
    from infir.model.linears import ColumnLinear

    if model.output_layer is not None and type(model.output_layer) is not ColumnLinear:
        model.output_layer.__class__ = ColumnLinear
    model.chunked_loss, model.loss_chunk_tokens = chunked_loss, loss_chunk_tokens
    # RoPE reads each rank's own position_ids (gpt.InfirGPTModel): megatron's slicing of the
    # rotary table for context parallelism must not apply on top.
    model.rotary_pos_emb.cp_group = None
    if model.embedding is not None:
        from infir.model.embedding import use_main_grad_lookup

        use_main_grad_lookup(model)
        model.embedding.register_forward_hook(_embedding_to_autocast_dtype)
    _attach_linear_hooks(model, transient_fp8_weights)
    return model


def _attach_linear_hooks(model, transient_fp8_weights: bool) -> None:
    """The layers' linears' hooks before each forward: the FP8 ones' weight refresh (per layer where their
    weights are transient), which also marks where they add into main_grad; the other ones' marks."""
    from infir.model.fp8_linears import Fp8Projection, attach_weight_refresh, fp8_linears_of, quantize_weights_per_layer
    from infir.model.linears import ColumnLinear, MainGradMarks, RowLinear

    fp8_linears = fp8_linears_of(model)
    if transient_fp8_weights:
        quantize_weights_per_layer(list(model.decoder.layers))
        per_layer = {id(m) for layer in model.decoder.layers for m in fp8_linears_of(layer)}
        fp8_linears = [m for m in fp8_linears if id(m) not in per_layer]
    if fp8_linears:
        attach_weight_refresh(model, fp8_linears)
    # the layers' other linears add their gradients into main_grad as the FP8 ones do (their refresh marks them);
    # not the LM head, whose weight the chunked loss, or a tied embedding's lookup, also writes
    high_precision = [m for m in model.decoder.modules()
                      if isinstance(m, (ColumnLinear, RowLinear)) and not isinstance(m, Fp8Projection)]
    if high_precision:
        model.register_forward_pre_hook(MainGradMarks(high_precision))


def _embedding_to_autocast_dtype(module, args, out):
    """Under autocast, the residual stream starts in the compute dtype (BF16), as megatron's
    Float16Module and HF's BF16 models run it: the FP32 master embedding would otherwise make every
    residual add, norm and projection input of the block FP32, twice the bytes (measured: the layer
    input was FP32 at 1.5B), with autocast casting it back to BF16 before each GEMM."""
    dev = out.device.type
    if torch.is_autocast_enabled(dev) and out.dtype == torch.float32:
        return out.to(torch.get_autocast_dtype(dev))
    return None


def describe(name: str) -> dict:
    size = get_size(name)
    return {"name": name, **asdict(size), "params": size.num_params()}
