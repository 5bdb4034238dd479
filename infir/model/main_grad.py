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
    return marks_main_grad(weight) and weight.requires_grad and torch.is_grad_enabled()


def marks_main_grad(weight: torch.Tensor) -> bool:
    """Whether a linear of this weight adds its gradient into megatron's FP32 main_grad (mark_main_grad_adds)."""
    main = getattr(weight, "main_grad", None)
    return main is not None and main.dtype == torch.float32


def mark_main_grad_adds(linears) -> None:
    """Before a forward: each linear whose weight has megatron's FP32 main_grad adds its weight gradient there
    in backward (`to_main_grad`), and its weight is marked for DDP's grad hook to skip the placeholder autograd
    gets (`grad_added_to_main_grad`, which megatron clears at every zero_grad_buffer, before the step's forwards).
    With BF16 gradient buffers the linears return the gradient instead: a sum of many adds would round at each."""
    for m in linears:
        m.to_main_grad = marks_main_grad(m.weight)
        if m.to_main_grad:
            m.weight.grad_added_to_main_grad = True


def add_product(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b, summed in acc's dtype (FP32) whatever the operands': on CUDA by the GEMM's epilogue
    (addmm's out_dtype, BF16 or FP16 operands into an FP32 output, what megatron's gradient_accumulation_fusion
    does through apex), elsewhere through a product in acc's dtype (CPU runs)."""
    if acc.is_cuda and a.dtype != acc.dtype:
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype))
