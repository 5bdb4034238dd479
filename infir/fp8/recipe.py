"""Precision recipes as data: for each GEMM operand of a linear layer, how it is quantized.

A linear layer Y = X W^T runs three GEMMs, each an "NT" product of two operands (gemm.py):

    fprop  Y  = X  W^T      input        along K        x  weight
    dgrad  dX = dY W        grad_output  along N        x  weight^T (the same blocks as W)
    wgrad  dW = dY^T X      grad_output^T along tokens  x  input^T   along tokens

so a recipe names one `OperandFormat` per operand role (as torchao's per-operand `CastConfig` and
Transformer Engine's recipe classes do). A role has one format in both GEMMs it enters, because its
two layouts come out of one quantizer pass (X and X^T, dY and dY^T: kernels/ write both at once).
`Recipe.gemm(name)` gives the (A, B) formats of each GEMM.

Beside the operand formats, a recipe holds the policies that go with it:
- `swiglu_input`: SwiGLU's input (the FC1 output, the largest activation a layer saves) kept for the
  backward in FP8 with this format (swiglu.py), or None to keep it in the compute dtype;
- `autoscale_weights` / `resync_interval`: MOSS automatic weight scaling (autoscale.py);
- `weight_refresh`: how the FP8 weights are re-quantized after each optimizer step: "graph" records
  every layer's refresh once as a CUDA graph and replays it (block weights only: their quantizer has no
  host-side state), "eager" quantizes weight by weight;
- `cuda_graphs`: whether a trainer's automatic compile mode takes CUDA graphs for the layers;
- `compute_dtype`: the dtype around the FP8 GEMMs (attention, norms, LM head) and of the non-FP8 recipes.

Recipes are values: a layer receives one at build time and never branches on a name. `RECIPES` is the
one registry, keyed by the option names of conf/precision/; a new recipe is an entry here (and, for the
trainer, a YAML naming it).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .formats import check_scale_format, get_format

OPERAND_GRANULARITIES = ("tensor", "token", "two_level")  # input and grad_output
WEIGHT_GRANULARITIES = ("tensor", "block")
GEMMS = ("fprop", "dgrad", "wgrad")
WEIGHT_REFRESH = ("graph", "eager")


@dataclass(frozen=True)
class OperandFormat:
    """How one operand is quantized: which elements share a scale (granularity, see quantize.py), the
    scale's format ("ue8m0" powers of two or "fp32") and the FP8 element format ("e4m3" or "e5m2")."""

    granularity: str
    scale_format: str = "ue8m0"
    fmt: str = "e4m3"

    def __post_init__(self):
        check_scale_format(self.scale_format)
        get_format(self.fmt)


@dataclass(frozen=True)
class Recipe:
    name: str
    input: OperandFormat | None = None
    weight: OperandFormat | None = None
    grad_output: OperandFormat | None = None
    swiglu_input: OperandFormat | None = None
    autoscale_weights: bool = False
    resync_interval: int = 500
    weight_refresh: str = "eager"
    cuda_graphs: bool = False
    compute_dtype: torch.dtype = torch.bfloat16

    def __post_init__(self):
        roles = (self.input, self.weight, self.grad_output)
        if all(r is None for r in roles):
            return self._check_high_precision()
        if any(r is None for r in roles):
            raise ValueError(f"Recipe {self.name!r}: give input, weight and grad_output formats, or none of them")
        for role, allowed in (("input", OPERAND_GRANULARITIES), ("grad_output", OPERAND_GRANULARITIES),
                              ("weight", WEIGHT_GRANULARITIES)):
            granularity = getattr(self, role).granularity
            if granularity not in allowed:
                raise ValueError(f"Recipe {self.name!r}: {role} granularity {granularity!r} is not one of {list(allowed)}")
        if self.swiglu_input is not None and self.swiglu_input.granularity != "token":
            raise ValueError(f"Recipe {self.name!r}: swiglu_input is kept per 1x128 block ('token'), "
                             f"not {self.swiglu_input.granularity!r}")
        if self.autoscale_weights and self.weight.granularity != "tensor":
            raise ValueError(f"Recipe {self.name!r}: autoscale_weights predicts one scale per tensor, "
                             f"so it needs weight granularity 'tensor', not {self.weight.granularity!r}")
        if self.resync_interval < 1:
            raise ValueError(f"Recipe {self.name!r}: resync_interval must be >= 1, got {self.resync_interval}")
        if self.weight_refresh not in WEIGHT_REFRESH:
            raise ValueError(f"Recipe {self.name!r}: weight_refresh={self.weight_refresh!r} is not one of {list(WEIGHT_REFRESH)}")
        if self.weight_refresh == "graph" and (self.weight.granularity != "block" or self.autoscale_weights):
            raise ValueError(f"Recipe {self.name!r}: weight_refresh='graph' replays block-weight quantizers only")

    def _check_high_precision(self) -> None:
        if self.swiglu_input is not None or self.autoscale_weights or self.cuda_graphs:
            raise ValueError(f"Recipe {self.name!r} quantizes no GEMM, so it takes no FP8 policy "
                             "(swiglu_input, autoscale_weights, cuda_graphs)")

    @property
    def fp8(self) -> bool:
        """Whether the linear layers' GEMMs run in FP8."""
        return self.input is not None

    def gemm(self, name: str) -> tuple[OperandFormat, OperandFormat]:
        """The (A, B) operand formats of GEMM `name` (fprop, dgrad or wgrad), C = A @ B^T."""
        if not self.fp8:
            raise ValueError(f"Recipe {self.name!r} runs no FP8 GEMM")
        pairs = {"fprop": (self.input, self.weight), "dgrad": (self.grad_output, self.weight),
                 "wgrad": (self.grad_output, self.input)}
        if name not in pairs:
            raise ValueError(f"unknown GEMM {name!r}; use one of {list(GEMMS)}")
        return pairs[name]

    def with_swiglu_input(self, enabled: bool) -> "Recipe":
        """This recipe with SwiGLU's input saved in FP8 (1x128 blocks in the input's formats) or not."""
        if enabled and not self.fp8:
            raise ValueError(f"SwiGLU's input in FP8 needs an FP8 recipe, not {self.name!r}")
        fmt = OperandFormat("token", self.input.scale_format, self.input.fmt) if enabled else None
        return replace(self, swiglu_input=fmt)


def _blockwise(name: str, scale_format: str, grad_fmt: str = "e4m3") -> Recipe:
    # CUDA graphs pay where the step waits on the host, not with E5M2's emulated GEMMs (see RECIPES)
    return Recipe(name, input=OperandFormat("token", scale_format), weight=OperandFormat("block", scale_format),
                  grad_output=OperandFormat("token", scale_format, grad_fmt), weight_refresh="graph",
                  cuda_graphs=grad_fmt == "e4m3")


def _per_tensor(name: str) -> Recipe:
    fmt = OperandFormat("tensor", "fp32")
    return Recipe(name, input=fmt, weight=fmt, grad_output=fmt)


def _moss(name: str) -> Recipe:
    two_level = OperandFormat("two_level", "fp32")
    return Recipe(name, input=two_level, weight=OperandFormat("tensor", "fp32"), grad_output=two_level,
                  autoscale_weights=True, resync_interval=500)


# The registry. InfiR2's recipe (TE's Float8BlockScaling): E4M3 forward and backward, activations and
# gradients per 1x128 along each GEMM's contraction dim, weights per 128x128 block, power-of-two
# scales. Its FP32-scale ablation. The E4M3/E5M2 hybrid of the FP8 formats paper (TE's default
# format): gradients keep E5M2's range, activations and weights E4M3's precision; on Hopper, torch's
# blockwise scaled_mm takes E4M3 operands only, so its dgrad and wgrad run the emulated GEMM there
# (gemm.blockwise_dtypes_ok): a numerics recipe, for parity runs, until a blockwise GEMM takes E5M2.
# Just-in-time per-tensor scales (LLMQ). MOSS: two-level microscaling, per-tensor weights with
# automatic scaling (the two-level operands enter the GEMM folded: quantize.fold_two_level).
RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("bf16"),
    Recipe("fp32", compute_dtype=torch.float32),
    _blockwise("fp8_blockwise_ue8m0", "ue8m0"),
    _blockwise("fp8_blockwise_fp32", "fp32"),
    _blockwise("fp8_blockwise_e5m2_grad", "ue8m0", grad_fmt="e5m2"),
    _per_tensor("fp8_tensorwise"),
    _moss("moss"),
)}


def get_recipe(name: str | Recipe) -> Recipe:
    """The registered Recipe of a conf/precision option name (a Recipe passes through)."""
    if isinstance(name, Recipe):
        return name
    if name not in RECIPES:
        raise ValueError(f"unknown precision recipe {name!r}; registered recipes: {sorted(RECIPES)}")
    return RECIPES[name]
