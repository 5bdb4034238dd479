"""Precision recipes: which granularity each GEMM operand of a linear layer is quantized with.

One Recipe per option of conf/precision/ (the registry key is the Hydra option name):
- bf16:                 no quantization (plain F.linear).
- fp8_blockwise_ue8m0:  InfiR2 / TE Float8BlockScaling: activations and gradients 1x128 along
                        each GEMM's contraction dim, weights 128x128, power-of-two (UE8M0) scales.
- fp8_blockwise_fp32:   the same with FP32 scales (InfiR2's "FP8 w. FP32 scale" ablation).
- fp8_tensorwise:       just-in-time per-tensor scales for every operand (LLMQ §3).
- moss:                 MOSS: two-level activations/gradients (FP32 row scale x E8M0 per 32),
                        per-tensor weights whose scale comes from automatic scaling (autoscale.py).
                        The two-level operands enter the GEMM folded (quantize.fold_two_level).
All FP8 recipes run fprop, dgrad and wgrad in E4M3 (InfiR2 uses E4M3 forward and backward).
"""
from __future__ import annotations

from dataclasses import dataclass

from .formats import check_scale_format, get_format

_OPERAND_GRANULARITIES = ("tensor", "token", "two_level")
_WEIGHT_GRANULARITIES = ("tensor", "block")


@dataclass(frozen=True)
class Recipe:
    name: str
    fp8: bool = True
    activation: str = "token"  # X along K (fprop) and X^T along tokens (wgrad)
    weight: str = "block"  # W (fprop) and the same blocks as W^T (dgrad)
    grad: str = "token"  # dY along N (dgrad) and dY^T along tokens (wgrad)
    scale_format: str = "ue8m0"
    fmt: str = "e4m3"
    autoscale_weights: bool = False  # MOSS automatic weight scaling instead of amax each step
    resync_interval: int = 500

    def __post_init__(self):
        if not self.fp8:
            return
        for field, value, allowed in (("activation", self.activation, _OPERAND_GRANULARITIES),
                                      ("grad", self.grad, _OPERAND_GRANULARITIES),
                                      ("weight", self.weight, _WEIGHT_GRANULARITIES)):
            if value not in allowed:
                raise ValueError(f"Recipe {self.name!r}: {field}={value!r} is not one of {list(allowed)}")
        check_scale_format(self.scale_format)
        get_format(self.fmt)
        if self.autoscale_weights and self.weight != "tensor":
            raise ValueError(f"Recipe {self.name!r}: autoscale_weights predicts one scale per tensor, "
                             f"so it needs weight='tensor', not {self.weight!r}")
        if self.resync_interval < 1:
            raise ValueError(f"Recipe {self.name!r}: resync_interval must be >= 1, got {self.resync_interval}")


def bf16() -> Recipe:
    return Recipe("bf16", fp8=False)


def fp8_blockwise(scale_format: str = "ue8m0") -> Recipe:
    return Recipe(f"fp8_blockwise_{scale_format}", activation="token", weight="block", grad="token",
                  scale_format=scale_format)


def fp8_tensorwise() -> Recipe:
    return Recipe("fp8_tensorwise", activation="tensor", weight="tensor", grad="tensor", scale_format="fp32")


def moss(resync_interval: int = 500) -> Recipe:
    return Recipe("moss", activation="two_level", weight="tensor", grad="two_level", scale_format="fp32",
                  autoscale_weights=True, resync_interval=resync_interval)


RECIPES = {
    "bf16": bf16,
    "fp8_blockwise_ue8m0": lambda: fp8_blockwise("ue8m0"),
    "fp8_blockwise_fp32": lambda: fp8_blockwise("fp32"),
    "fp8_tensorwise": fp8_tensorwise,
    "moss": moss,
}


def get_recipe(name: str | Recipe) -> Recipe:
    """The Recipe for a conf/precision option name (a Recipe passes through)."""
    if isinstance(name, Recipe):
        return name
    if name not in RECIPES:
        raise ValueError(f"unknown precision recipe {name!r}; conf/precision options are {sorted(RECIPES)}")
    return RECIPES[name]()
