"""Precision recipes as seen by the trainer: which linears the model is built with, and the compute
dtype around them. Keyed by the `precision.recipe` option of conf/precision/*.yaml.

A recipe is a converter in torchtitan's sense: it picks the layer classes of the spec and gets a hook
after every optimizer step (where FP8 recipes re-quantize their weights once for all micro-batches).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from infir.model.spec import LinearClasses


@dataclass
class PrecisionRecipe:
    name: str
    compute_dtype: torch.dtype
    linears: LinearClasses = field(default_factory=LinearClasses)
    swiglu: object | None = None  # ModuleSpec of the MLP activation; None: megatron's SwiGLU, input saved in BF16

    def autocast(self, device: torch.device):
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.compute_dtype)

    def after_optimizer_step(self, model: torch.nn.Module, lr: float) -> None:
        """FP8 layers re-quantize their weights once for the next step's micro-batches (and MOSS
        advances its predicted weight bound by the step's learning rate); others hold nothing."""
        for module in model.modules():
            cache = getattr(module, "weight_cache", None)
            if cache is not None:
                cache.step(lr)


def _fp8(name: str, fp8_swiglu_input: bool = False) -> PrecisionRecipe:
    from megatron.core.transformer.spec_utils import ModuleSpec

    from infir.fp8 import get_recipe as fp8_recipe
    from infir.model.fp8_linears import fp8_linear_classes
    from infir.model.fp8_swiglu import SwiGLUInFc1

    # FP8 block GEMMs; embedding, attention, norms, LM head and loss stay BF16/FP32 (InfiR2, LLMQ).
    if not fp8_swiglu_input:
        return PrecisionRecipe(name, torch.bfloat16, fp8_linear_classes(name))
    r = fp8_recipe(name)
    # 1x128 blocks whatever the recipe's GEMM granularity: this copy only feeds SwiGLU's backward.
    # FC1 applies SwiGLU itself; the MLP's activation is then the identity (fp8_swiglu.py says why).
    linears = fp8_linear_classes(name, swiglu=(r.scale_format, r.fmt))
    return PrecisionRecipe(name, torch.bfloat16, linears, ModuleSpec(module=SwiGLUInFc1))


def _te_blockwise() -> PrecisionRecipe:
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "precision=te_blockwise runs Transformer Engine's Float8BlockScaling, and transformer_engine is not "
            "importable here. Use the NGC image (Dockerfile) or `pip install infir[te]`, or pick an infir recipe: "
            "precision=fp8_blockwise_ue8m0"
        ) from None
    raise NotImplementedError(
        "precision=te_blockwise: Transformer Engine is installed, but infir's megatron spec does not build TE "
        "layers yet; use precision=fp8_blockwise_ue8m0 (the same InfiR2 recipe in infir.fp8)"
    )


RECIPES = {
    "bf16": lambda: PrecisionRecipe("bf16", torch.bfloat16),
    "fp32": lambda: PrecisionRecipe("fp32", torch.float32),
    "fp8_blockwise_ue8m0": lambda **kw: _fp8("fp8_blockwise_ue8m0", **kw),
    "fp8_blockwise_fp32": lambda **kw: _fp8("fp8_blockwise_fp32", **kw),
    "fp8_tensorwise": lambda **kw: _fp8("fp8_tensorwise", **kw),
    "moss": lambda **kw: _fp8("moss", **kw),
    "te_blockwise": _te_blockwise,
}
FP8_RECIPES = ("fp8_blockwise_ue8m0", "fp8_blockwise_fp32", "fp8_tensorwise", "moss")


def get_recipe(name: str, fp8_swiglu_input: bool = False) -> PrecisionRecipe:
    """`fp8_swiglu_input` (conf/precision: true for the FP8 recipes) keeps SwiGLU's input for the
    backward in FP8 (infir.fp8.swiglu); the config validation refuses it for non-FP8 recipes."""
    if name not in RECIPES:
        raise KeyError(f"precision.recipe={name!r} is not registered; valid: {sorted(RECIPES)}")
    if not fp8_swiglu_input:
        return RECIPES[name]()
    if name not in FP8_RECIPES:
        raise ValueError(f"precision.fp8_swiglu_input=true needs an FP8 recipe ({', '.join(FP8_RECIPES)}), "
                         f"not {name!r}: set precision.fp8_swiglu_input=false")
    return RECIPES[name](fp8_swiglu_input=True)
