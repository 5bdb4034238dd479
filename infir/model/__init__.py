"""Qwen2.5-family models on megatron-core: size table, layer spec, HF conversion."""
from infir.model.qwen import SIZES, QwenSize, build_gpt, check_parallel, get_size, transformer_config

__all__ = ["SIZES", "QwenSize", "build_gpt", "check_parallel", "get_size", "transformer_config"]
