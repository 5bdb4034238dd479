"""Whether a layer may add its weight gradient into megatron DDP's FP32 `main_grad` itself.

Where megatron's DDP holds an FP32 `main_grad` for a weight, a layer that computes the weight's gradient in
FP32 can add it there in its own backward (and hand autograd an unwritten placeholder, which DDP's hook skips
through `grad_added_to_main_grad`), saving the passes of returning it. Without DDP (one rank, gradient
release) or with BF16 gradient buffers, where a sum of many adds would round at each one, the layer returns its
gradient as autograd expects.
"""
from __future__ import annotations

import torch


def adds_into_main_grad(weight: torch.Tensor) -> bool:
    """True where `weight` has an FP32 main_grad and this forward builds a graph for its gradient."""
    main = getattr(weight, "main_grad", None)
    return main is not None and main.dtype == torch.float32 and weight.requires_grad and torch.is_grad_enabled()
