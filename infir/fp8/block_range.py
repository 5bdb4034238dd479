"""128x128-block quantization of a contiguous element range of a weight, with scales from the whole
weight: what a data-parallel rank does with its shard of the updated weights before the FP8 parameter
all-gather (infir/train/fp8_param_gather.py).

A ZeRO-1 shard is a range of the weight's row-major elements that starts and ends anywhere, so it
cuts 128x128 blocks. Two passes make the result the bytes of quantizing the whole weight:
`block_range_amax` writes the amax of the range's elements in every block of the 128-row bands it
touches (0 where it has none), the ranks' amaxes are reduced with MAX, and `quantize_block_range`
divides the range by those blocks' scales. Plain PyTorch here (the reference, any device); the Triton
twins are kernels/quant_block_range.py, held to these bit for bit (kernels/registry.py).
"""
from __future__ import annotations

import torch

from .formats import amax_with_nan_as_inf, cast_to_fp8, get_format
from .quantize import WEIGHT_BLOCK, _expand, _pad_last


def row_bands(start: int, numel: int, shape: tuple[int, int]) -> tuple[int, int]:
    """(first, end) 128-row bands of a [N, K] weight that elements [start, start + numel) touch."""
    k = shape[1]
    if numel <= 0 or start < 0 or start + numel > shape[0] * k:
        raise ValueError(f"range [{start}, {start + numel}) is not a non-empty range of a {tuple(shape)} weight")
    return start // k // WEIGHT_BLOCK, ((start + numel - 1) // k) // WEIGHT_BLOCK + 1


def _band_tile(flat: torch.Tensor, start: int, shape: tuple[int, int]) -> tuple[torch.Tensor, int]:
    """The range's bands as a [rows, K] float32 tile holding the range's values, zeros elsewhere; the
    element offset of the range in it."""
    k = shape[1]
    b0, b1 = row_bands(start, flat.numel(), shape)
    rows = min(b1 * WEIGHT_BLOCK, shape[0]) - b0 * WEIGHT_BLOCK
    tile = flat.new_zeros(rows * k, dtype=torch.float32)
    at = start - b0 * WEIGHT_BLOCK * k
    tile[at:at + flat.numel()] = flat.float()
    return tile.view(rows, k), at


def block_range_amax_reference(flat: torch.Tensor, start: int, shape: tuple[int, int], out: torch.Tensor) -> torch.Tensor:
    """Into out [ceil(N/128), ceil(K/128)], rows of the touched bands: per block, max |x| over the range's
    elements x (NaN as +inf; 0 for a block without one). Other rows of out are left as they are."""
    b0, b1 = row_bands(start, flat.numel(), shape)
    tile, _ = _band_tile(flat, start, shape)
    padded = _pad_last(_pad_last(tile, WEIGHT_BLOCK, -1), WEIGHT_BLOCK, -2)
    blocks = padded.unflatten(-1, (-1, WEIGHT_BLOCK)).unflatten(-3, (-1, WEIGHT_BLOCK))
    out[b0:b1] = amax_with_nan_as_inf(blocks, dim=(-3, -1))
    return out


def quantize_block_range_reference(flat: torch.Tensor, start: int, shape: tuple[int, int], scale: torch.Tensor,
                                   fmt: str) -> torch.Tensor:
    """The range's elements divided by their blocks' `scale` ([ceil(N/128), ceil(K/128)]) and cast to FP8:
    exactly the bytes at those positions of the whole weight quantized with the same scales."""
    k = shape[1]
    b0, b1 = row_bands(start, flat.numel(), shape)
    tile, at = _band_tile(flat, start, shape)
    band = scale[b0:b1]
    full = _expand(_expand(band, WEIGHT_BLOCK, k, -1), WEIGHT_BLOCK, tile.shape[0], -2)
    q = cast_to_fp8(tile / full, get_format(fmt))
    return q.view(-1)[at:at + flat.numel()]
