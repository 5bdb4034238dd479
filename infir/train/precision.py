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

    def autocast(self, device: torch.device):
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.compute_dtype)

    def after_optimizer_step(self, model: torch.nn.Module) -> None:
        """Nothing to refresh for high-precision recipes."""


RECIPES = {
    "bf16": lambda: PrecisionRecipe("bf16", torch.bfloat16),
    "fp32": lambda: PrecisionRecipe("fp32", torch.float32),
}


def get_recipe(name: str) -> PrecisionRecipe:
    if name not in RECIPES:
        raise KeyError(f"precision.recipe={name!r} is not registered; valid: {sorted(RECIPES)}")
    return RECIPES[name]()
