"""Block-FP8 tensors of an FP8-trained checkpoint, in the layout transformers' FineGrainedFP8 and vLLM's
`fp8` method load (DeepSeek-V3's and Qwen3-FP8's):

    <proj>.weight            float8_e4m3fn [out, in]
    <proj>.weight_scale_inv  float32 [ceil(out/128), ceil(in/128)]: weight ~= fp8 x scale_inv, block by block

for every block GEMM (q/k/v/o, gate/up/down projections); `quantization_config` in config.json names
the method. ("scale_inv" is the loaders' name: it is the dequantization multiplier, infir's QTensor.scale.)
Embeddings, norms, biases and the LM head stay high precision, as training keeps them.

The FP8 values are those training computes: each TP rank's weight shard goes through an FP8 layer's own
`WeightCache` with the run's recipe (the same quantizer, blocks and scale format: UE8M0 scales stay
powers of two), and its FP8 bytes and per-element scales then travel through convert.py's TP merge,
QKV de-interleave and gate/up split like the weight itself. An HF 128x128 block keeps training's bytes
and scale wherever training used one scale over all its elements. Where megatron's fused tensors split
at a row (or a TP rank boundary) that is not a multiple of 128, an HF block can hold parts of two of
training's blocks with different scales, which no single scale represents: such blocks are quantized
afresh from the checkpoint's weight with the recipe's quantizer, and reported. Of the Qwen2.5 shapes
only 0.5B has such splits: its head_dim of 64 puts each query group's K and V rows (64 each) in 128-row
blocks shared with Q, so some q/k/v blocks are re-quantized; 1.5B, 3B and 7B split at multiples of 128
(at their usual TP sizes too), so every block is training's.

The bytes are those of the checkpoint's weights: what the next training step, or an infir FP8 forward
of this checkpoint, multiplies with.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from infir.fp8 import RECIPES, Recipe, WeightCache
from infir.fp8.dispatch import quantize_weight
from infir.fp8.formats import FORMATS, get_format
from infir.fp8.quantize import WEIGHT_BLOCK

BLOCK_GEMMS = ("linear_qkv.weight", "linear_proj.weight", "linear_fc1.weight", "linear_fc2.weight")
SCALE_SUFFIX = "weight_scale_inv"


def is_block_gemm(mcore_key: str) -> bool:
    return mcore_key.endswith(BLOCK_GEMMS)


def scale_name(hf_weight: str) -> str:
    return hf_weight.removesuffix("weight") + SCALE_SUFFIX


def keeps_dtype(name: str, t: torch.Tensor) -> bool:
    """FP8 weights and their scales are written as they are, whatever dtype the other tensors take."""
    return name.endswith(SCALE_SUFFIX) or t.dtype in {f.dtype for f in FORMATS.values()}


def quantization_config() -> dict:
    """config.json's `quantization_config`. The LM head is named because transformers converts every
    nn.Linear not listed, and Qwen2's lm_head is one (tied to the embedding in the small sizes)."""
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [WEIGHT_BLOCK, WEIGHT_BLOCK], "modules_to_not_convert": ["lm_head"]}


def export_recipe(meta: dict, where) -> Recipe:
    """The recipe a checkpoint was trained with (meta.json), once it is one whose FP8 weights the
    checkpoint determines."""
    name = meta.get("recipe") or meta.get("precision")
    recipe = RECIPES.get(name)
    if recipe is None or not recipe.fp8:
        trained = f"trained with precision={name}" if name else "not trained by infir (converted from HF weights)"
        raise ValueError(f"--fp8 needs a checkpoint trained with an FP8 recipe, and {where} was {trained}: "
                         "export it without --fp8 (high-precision weights)")
    if recipe.autoscale_weights:
        raise ValueError(f"--fp8: {where} was trained with {name}, whose weight scales follow the optimizer's "
                         "updates (automatic scaling), a state the checkpoint does not keep: export it without --fp8")
    return recipe


def training_fp8(name: str, weight: torch.Tensor, recipe: Recipe) -> tuple[torch.Tensor, torch.Tensor]:
    """The FP8 copy an infir FP8 layer makes of `weight`, as its FP8 bytes (uint8) and each element's
    scale (float32): two tensors of the weight's shape that the TP merge and HF split move like it."""
    if not torch.isfinite(weight).all():
        raise ValueError(f"{name} holds NaN or inf: the checkpoint is damaged; export an earlier iteration")
    q = WeightCache(name).get(weight, recipe)
    scale = q.scale.expand(q.data.shape) if q.scale.dim() == 0 else _expand(q.scale, q.data.shape)
    return q.data.view(torch.uint8), scale.contiguous()


def block_fp8(data: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, recipe: Recipe):
    """One HF weight: (FP8 weight, scale_inv per 128x128 block, number of blocks quantized afresh).

    `data`/`scale`: training's bytes and per-element scales at this HF tensor's positions; `weight`:
    its high-precision values, for the blocks that training's scales do not fit."""
    blocks = scale[::WEIGHT_BLOCK, ::WEIGHT_BLOCK].clone(memory_format=torch.contiguous_format)  # own storage: saved alone
    mixed = _any_per_block(_expand(blocks, scale.shape) != scale)
    if mixed.any():
        fresh = quantize_weight(weight, "block", recipe.weight.scale_format, recipe.weight.fmt)
        data = torch.where(_expand(mixed, data.shape), fresh.data.view(torch.uint8), data)
        blocks = torch.where(mixed, fresh.scale, blocks)
    return data.view(get_format(recipe.weight.fmt).dtype), blocks, int(mixed.sum())


def _expand(blocks: torch.Tensor, shape) -> torch.Tensor:
    """Each block's value over its 128x128 elements, cut to `shape`."""
    rows, cols = shape
    return blocks.repeat_interleave(WEIGHT_BLOCK, 0)[:rows].repeat_interleave(WEIGHT_BLOCK, 1)[:, :cols]


def _any_per_block(mask: torch.Tensor) -> torch.Tensor:
    rows, cols = mask.shape
    padded = F.pad(mask.to(torch.uint8), (0, -cols % WEIGHT_BLOCK, 0, -rows % WEIGHT_BLOCK))
    return padded.unflatten(1, (-1, WEIGHT_BLOCK)).unflatten(0, (-1, WEIGHT_BLOCK)).amax(dim=(1, 3)).bool()
