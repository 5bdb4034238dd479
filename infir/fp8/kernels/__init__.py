"""Triton kernels of infir.fp8, and two CUDA C++ quantizers (quant_both.cu, quant_two_level.cu; built by
nvcc on first use, see cuda_build.py) that the wrappers below pick where they are faster; each kernel has
its plain-PyTorch twin in infir/fp8/quantize.py, gemm.py or swiglu.py. lt_wgrad.cu calls cuBLASLt for the
wgrad GEMM (gemm.py takes it where it builds; torch's scaled_mm is its twin, bit for bit)."""
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
