"""infir.fp8: FP8 numerics for training (PyTorch + Triton, two CUDA C++ quantizers built on first use where
nvcc exists; no megatron import)."""
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
