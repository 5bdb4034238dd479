"""infir.fp8: FP8 numerics for training (PyTorch + Triton, two CUDA C++ quantizers built on first use where
nvcc exists; no megatron import)."""
from .autoscale import AutoScaler
from .comm import LOCAL, Local, SequenceParallel
from .gemm import fp8_gemm
from .linear import Fp8Linear, Fp8LinearFunction, Fp8SwiGLUOutput, LinearSpec, fp8_linear, linear
from .quantize import QTensor, dequantize, quant_stats, quantization_snr_db, quantize
from .recipe import RECIPES, OperandFormat, Recipe, get_recipe
from .weight_cache import WeightCache, tensors_of

__all__ = [
    "LOCAL", "AutoScaler", "Fp8Linear", "Fp8LinearFunction", "Fp8SwiGLUOutput", "LinearSpec", "Local", "OperandFormat",
    "QTensor", "RECIPES", "Recipe", "SequenceParallel", "WeightCache", "dequantize", "fp8_gemm", "fp8_linear",
    "get_recipe", "linear", "quant_stats", "quantization_snr_db", "quantize", "tensors_of",
]
