"""quantize_triton: the reference quantize()'s arguments and QTensor (any granularity, any leading
dims), on the Triton kernel of each granularity: the `impl="triton"` of dispatch.quantize."""
from __future__ import annotations

import torch

from ..quantize import QTensor
from .quant_block import quantize_block_triton
from .quant_tensor import quantize_tensor_triton
from .quant_token import quantize_token_triton
from .quant_two_level import quantize_two_level_triton
from .triton_fp8 import as_2d


def quantize_triton(x: torch.Tensor, granularity: str, scale_format: str = "ue8m0", fmt: str = "e4m3") -> QTensor:
    """The public quantize() on the Triton path: same arguments, same QTensor, same bits."""
    if granularity == "block" and x.dim() != 2:
        raise ValueError(f"the Triton block quantizer takes 2-D tensors, got shape {tuple(x.shape)}; "
                         "use impl='reference' for batched blocks")
    lead = x.shape[:-1]
    x2 = as_2d(x)
    if granularity == "token":
        q, _ = quantize_token_triton(x2, scale_format, fmt)
    elif granularity == "block":
        q = quantize_block_triton(x2, scale_format, fmt)
    elif granularity == "two_level":
        q = quantize_two_level_triton(x2, scale_format, fmt)
    elif granularity == "tensor":
        q, _ = quantize_tensor_triton(x2.reshape(1, -1) if x2.dim() != 2 else x2, scale_format, fmt)
    else:
        raise ValueError(f"unknown granularity {granularity!r}")
    if granularity == "block" or x.dim() == 2:
        return q
    q.data = q.data.reshape(x.shape)
    if granularity in ("token", "two_level"):
        q.scale = q.scale.reshape(*lead, q.scale.shape[-1])
    if granularity == "two_level":
        q.global_scale = q.global_scale.reshape(lead)
        q.local_exp = q.local_exp.reshape(*lead, q.local_exp.shape[-1])
    return q
