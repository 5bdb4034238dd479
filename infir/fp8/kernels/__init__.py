"""The fast kernels of infir.fp8, one module per family, each with its plain-PyTorch reference named
in its docstring (infir/fp8/quantize.py, swiglu_reference.py, gemm_reference.py, lm_loss_reference.py)
and held to it by tests/fp8/test_kernel_pairs.py over registry.PAIRS:

  triton_fp8       the Triton helpers every quantizer shares (scale from amax, RNE cast, quotients)
  quant_token      1x128 scales along K, in both GEMM layouts (quant_both.cu is one more candidate)
  quant_block      128x128 scales (weights)
  quant_tensor     per-tensor scales and the amax pass
  quant_two_level  MOSS two-level rows and their folded GEMM operand (quant_two_level.cu beside it)
  quant_any        quantize_triton: any granularity and leading shape
  transpose        the 2-D transpose of FP8 (and wider) matrices
  swiglu           SwiGLU with its input saved in FP8, fused with FC2's and FC1's operands
  gemm_two_level   the exact MOSS two-level GEMM
  lt_wgrad         the wgrad GEMM through cuBLASLt (lt_wgrad.cu)
  lm_loss          the chunked LM loss's softmax statistics and logit gradient
  autotune         candidate configurations, the first-call timing, the launch cache
  cuda_lib         the CUDA C++ kernels' ctypes entry points and which inputs they take
  cuda_build       nvcc on first use, cached per source, GPU and nvcc version
  registry         every (kernel, reference) pair, its inputs and how the two must agree

Which of them run is infir.fp8.policy's and infir.fp8.dispatch's choice.
"""
from .quant_any import quantize_triton
from .quant_block import quantize_block_triton
from .quant_tensor import amax_triton, quantize_tensor_triton
from .quant_token import quantize_token_triton
from .quant_two_level import quantize_two_level_triton
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
