"""`QwenSize` <-> `transformers.Qwen2Config`: the architecture half of HF conversion.

Only what the megatron model can represent is accepted: a config using sliding-window attention,
RoPE scaling (YaRN and friends), a head_dim other than hidden / heads, or an activation other than
SiLU would convert to a model that silently computes something else, so those raise instead.
"""
from __future__ import annotations

import inspect
from dataclasses import replace

from infir.model.qwen import SIZES, QwenSize


def _config_class():
    from transformers import Qwen2Config

    return Qwen2Config


def _rope_theta_kwargs(theta: float) -> dict:
    # transformers 5 moved `rope_theta` into `rope_parameters`; 4.x still takes it as a keyword.
    if "rope_parameters" in inspect.signature(_config_class().__init__).parameters:
        return {"rope_parameters": {"rope_type": "default", "rope_theta": float(theta)}}
    return {"rope_theta": float(theta), "rope_scaling": None}


def _dtype_kwargs(dtype) -> dict:
    if dtype is None:
        return {}
    # transformers 5 names the weights' dtype `dtype`; 4.x calls it `torch_dtype`.
    key = "dtype" if "dtype" in inspect.signature(_config_class().__init__).parameters else "torch_dtype"
    return {key: dtype}


def hf_config(size: QwenSize, *, dtype=None, **extra) -> "transformers.Qwen2Config":  # noqa: F821
    """The HF config of `size`; `extra` carries non-architecture fields (token ids)."""
    return _config_class()(
        architectures=["Qwen2ForCausalLM"],
        vocab_size=size.vocab,
        hidden_size=size.hidden,
        intermediate_size=size.ffn,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        hidden_act="silu",
        max_position_embeddings=size.max_positions,
        rms_norm_eps=size.norm_eps,
        tie_word_embeddings=size.tied,
        use_sliding_window=False,
        attention_dropout=0.0,
        **_rope_theta_kwargs(size.rope_theta),
        **_dtype_kwargs(dtype),
        **extra,
    )


def _rope(cfg) -> tuple[float, str]:
    params = getattr(cfg, "rope_parameters", None)
    if params:  # transformers 5
        return float(params["rope_theta"]), params.get("rope_type", "default")
    scaling = getattr(cfg, "rope_scaling", None) or {}
    return float(cfg.rope_theta), scaling.get("rope_type", scaling.get("type", "default"))


def size_from_hf_config(cfg) -> QwenSize:
    """The `QwenSize` of a Qwen2 config (a `Qwen2Config` or its config.json as a dict)."""
    if isinstance(cfg, dict):
        model_type = cfg.get("model_type")
        if model_type != "qwen2":
            raise ValueError(
                f"config.json has model_type={model_type!r}; infir-convert handles Qwen2/Qwen2.5 checkpoints (model_type 'qwen2')"
            )
        cfg = _config_class().from_dict(cfg)
    if getattr(cfg, "model_type", None) != "qwen2":
        raise ValueError(
            f"config has model_type={getattr(cfg, 'model_type', None)!r}; infir-convert handles Qwen2/Qwen2.5 (model_type 'qwen2')"
        )
    if cfg.hidden_act != "silu":
        raise ValueError(f"hidden_act={cfg.hidden_act!r}: infir's Qwen2 MLP is SwiGLU and needs hidden_act='silu'")
    if getattr(cfg, "use_sliding_window", False):
        raise ValueError("use_sliding_window=true: infir's attention is full causal attention; convert a config without it")
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ValueError(f"hidden_size={cfg.hidden_size} is not divisible by num_attention_heads={cfg.num_attention_heads}")
    head_dim = getattr(cfg, "head_dim", None)
    if head_dim is not None and head_dim != cfg.hidden_size // cfg.num_attention_heads:
        raise ValueError(f"head_dim={head_dim} differs from hidden_size / num_attention_heads; infir's QwenSize derives it")
    theta, rope_type = _rope(cfg)
    if rope_type != "default":
        raise ValueError(f"RoPE scaling {rope_type!r} is not implemented by infir's model; remove rope scaling from config.json")
    kv_heads = cfg.num_key_value_heads or cfg.num_attention_heads
    return QwenSize(
        hidden=cfg.hidden_size,
        layers=cfg.num_hidden_layers,
        heads=cfg.num_attention_heads,
        kv_heads=kv_heads,
        ffn=cfg.intermediate_size,
        vocab=cfg.vocab_size,
        tied=bool(cfg.tie_word_embeddings),
        max_positions=cfg.max_position_embeddings,
        rope_theta=theta,
        norm_eps=cfg.rms_norm_eps,
    )


def size_name(size: QwenSize) -> str | None:
    """The `SIZES` name with this architecture (context length aside: base and instruct configs differ there)."""
    for name, known in SIZES.items():
        if replace(known, max_positions=size.max_positions) == size:
            return name
    return None
