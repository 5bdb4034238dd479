"""Triton kernels of infir.fp8; each has its plain-PyTorch twin in infir/fp8/quantize.py, gemm.py or swiglu.py."""
from .quant import (
    amax_triton,
    quantize_block_triton,
    quantize_tensor_triton,
    quantize_token_triton,
    quantize_triton,
    quantize_two_level_triton,
)
from .transpose import transpose_2d

__all__ = [
    "amax_triton",
    "quantize_block_triton",
    "quantize_tensor_triton",
    "quantize_token_triton",
    "quantize_triton",
    "quantize_two_level_triton",
    "transpose_2d",
]
