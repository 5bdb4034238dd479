"""The MLP activation of FP8 recipes with SwiGLU's input saved in FP8: the identity, because FC1 applies
SwiGLU itself as the FP8 core's epilogue (infir.fp8.linear, infir.fp8.swiglu).

Why in FC1 and not here: inside a compiled layer, FC1's backward then goes from dY of the SwiGLU output
straight to FC1's FP8 gradient operands in one kernel, without writing dh (2 x ffn values a token,
the widest gradient of the layer) in bf16 and reading it back to quantize it; and its forward hands
y to FC2 already quantized (infir.fp8.Fp8SwiGLUOutput, which this identity passes on). megatron's MLP builds
`MLPSubmodules.activation_func` as a module and applies it only when `use_te_activation_func` is set
(the flag's name is historical: no Transformer Engine is involved), so the recipe sets that flag
together with this module, which megatron's own SwiGLU would otherwise run after FC1.
"""
from __future__ import annotations

import torch


class SwiGLUInFc1(torch.nn.Module):
    def __init__(self, config=None):
        super().__init__()

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y

    def extra_repr(self) -> str:
        return "identity: linear_fc1 applies SwiGLU, its input saved in FP8"
