"""The MLP activation of FP8 recipes: SwiGLU that saves its input for the backward in FP8 (infir.fp8.swiglu).

megatron's MLP builds `MLPSubmodules.activation_func` as a module and applies it to the whole FC1
output only when `use_te_activation_func` is set (the flag's name is historical: the module is ours,
no Transformer Engine is involved), so the recipe sets that flag together with this module.
"""
from __future__ import annotations

import torch

from infir.fp8.swiglu import swiglu_fp8_input


class Fp8InputSwiGLU(torch.nn.Module):
    def __init__(self, config=None, *, scale_format: str = "ue8m0", fmt: str = "e4m3"):
        super().__init__()
        self.scale_format, self.fmt = scale_format, fmt

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return swiglu_fp8_input(h, self.scale_format, self.fmt)

    def extra_repr(self) -> str:
        return f"saved input: {self.fmt}, 1x128 {self.scale_format} scales"
