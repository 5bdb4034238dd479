"""infir: an open FP8 training recipe for reasoning LLMs on megatron-core."""

__version__ = "0.1.0"
