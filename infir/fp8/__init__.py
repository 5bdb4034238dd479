"""infir.fp8: FP8 numerics for training (PyTorch + Triton, two CUDA C++ quantizers built on first use where
nvcc exists; no megatron import). In layers, each importing only from the layers listed before it:

  reference   formats.py, quantize.py (QTensor, the quantizers, dequantize), swiglu_reference.py,
              gemm_reference.py, lm_loss_reference.py: plain PyTorch, any device, no kernel
  kernels/    the fast kernels, one module per family, each held to its reference (kernels/registry.py)
  policy.py   which kernels may run and how their configurations are picked (from the environment)
  dispatch.py reference or kernel for each quantization: quantize, quantize_pair, transposed, transpose_q
  gemm.py, swiglu.py, linear.py, traced.py   the GEMM backends, SwiGLU, the FP8 linear layer on top
"""
from .autoscale import AutoScaler
from .gemm import fp8_gemm
from .linear import Fp8Linear, Fp8LinearFunction, WeightCache, linear
from .quantize import QTensor, dequantize, quant_stats, quantization_snr_db
from .recipe import RECIPES, Recipe, get_recipe
# after the submodule infir.fp8.quantize is loaded, so that the name `quantize` is this function
from .dispatch import quantize, quantize_pair  # noqa: E402

__all__ = [
    "AutoScaler", "Fp8Linear", "Fp8LinearFunction", "QTensor", "RECIPES", "Recipe", "WeightCache",
    "dequantize", "fp8_gemm", "get_recipe", "linear", "quant_stats", "quantization_snr_db", "quantize", "quantize_pair",
]
