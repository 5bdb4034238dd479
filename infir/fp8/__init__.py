"""infir.fp8: FP8 numerics for training (PyTorch + Triton, two CUDA C++ quantizers built on first use where
nvcc exists; no megatron import). In layers, each importing only from the layers listed before it:

  reference   formats.py, quantize.py (QTensor, the quantizers, dequantize), swiglu_reference.py,
              gemm_reference.py, lm_loss_reference.py: plain PyTorch, any device, no kernel
  kernels/    the fast kernels, one module per family, each held to its reference (kernels/registry.py)
  policy.py   which kernels may run and how their configurations are picked (from the environment)
  dispatch.py reference or kernel for each quantization: quantize, quantize_pair, transposed, transpose_q
  gemm.py, swiglu.py  the GEMM backends, SwiGLU with its input kept in FP8
  sp_overlap.py  sequence-parallel collectives split per rank around a GEMM (torch.distributed only)
  recipe.py, ops.py, comm.py, weight_cache.py, linear.py   the recipes as data; the one FP8 linear core on top:
              its graph ops, its communication strategies, the weight's FP8 copy, the autograd Function
"""
from .autoscale import AutoScaler
from .comm import LOCAL, Local, SequenceParallel, SequenceParallelOutput
from .gemm import fp8_gemm
from .linear import Fp8Linear, Fp8LinearFunction, Fp8SwiGLUOutput, LinearSpec, fp8_linear, linear
from .quantize import QTensor, dequantize, quant_stats, quantization_snr_db
from .recipe import RECIPES, OperandFormat, Recipe, get_recipe
from .weight_cache import WeightCache, tensors_of
# after the submodule infir.fp8.quantize is loaded, so that the name `quantize` is this function
from .dispatch import quantize, quantize_pair  # noqa: E402

__all__ = [
    "LOCAL", "AutoScaler", "Fp8Linear", "Fp8LinearFunction", "Fp8SwiGLUOutput", "LinearSpec", "Local", "OperandFormat",
    "QTensor", "RECIPES", "Recipe", "SequenceParallel", "SequenceParallelOutput", "WeightCache", "dequantize", "fp8_gemm",
    "fp8_linear", "get_recipe", "linear", "quant_stats", "quantization_snr_db", "quantize", "quantize_pair", "tensors_of",
]
