"""The run's precision recipe, built once from its conf/precision/*.yaml, and what the trainer does with it.

The YAML names a registered `infir.fp8.Recipe` (`recipe:`) and sets the trainer's policy switches
(`fp8_swiglu_input`); the built Recipe then travels to the layers through the model's spec, and the
trainer reads its fields (compute dtype, CUDA graphs), never its name.
"""
from __future__ import annotations

import contextlib

import torch

from infir.fp8 import RECIPES, Recipe


def build_recipe(precision) -> Recipe:
    """The Recipe of a `precision` config node (conf/precision/*.yaml). Raises ValueError naming the key."""
    name = precision.recipe
    if name not in RECIPES:
        raise ValueError(f"precision.recipe={name!r} is not valid: expected one of {sorted(RECIPES)}")
    recipe = RECIPES[name]
    swiglu_fp8 = bool(precision.fp8_swiglu_input)
    if swiglu_fp8 and not recipe.fp8:
        fp8 = sorted(n for n, r in RECIPES.items() if r.fp8)
        raise ValueError(f"precision.fp8_swiglu_input=true is not valid with precision.recipe={name} (it quantizes no "
                         f"GEMM): expected false, or an FP8 recipe: {', '.join(fp8)}")
    return recipe.with_swiglu_input(swiglu_fp8) if recipe.fp8 else recipe


def autocast(recipe: Recipe, device: torch.device):
    """The compute dtype's autocast around forward and loss (none for FP32 recipes)."""
    if recipe.compute_dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=recipe.compute_dtype)


def after_optimizer_step(model: torch.nn.Module, lr: float) -> None:
    """FP8 layers re-quantize their weights once for the next step's micro-batches (and MOSS
    advances its predicted weight bound by the step's learning rate); others hold nothing."""
    for module in model.modules():
        cache = getattr(module, "weight_cache", None)
        if cache is not None:
            cache.step(lr)
