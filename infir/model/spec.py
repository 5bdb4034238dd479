"""The transformer-layer spec of infir's Qwen2.5 models, as a megatron-core ModuleSpec tree.

Megatron stays unmodified: this function returns the same tree as megatron's local GPT spec
(TransformerLayer -> SelfAttention(linear_qkv, core_attention, linear_proj) -> MLP(linear_fc1,
linear_fc2)) with two substitutions — core attention through torch's kernels (see attention.py), and the four
projections, which run `infir.fp8` under an FP8 recipe: the recipe reaches each of them as a
ModuleSpec param, once, at build time. Norms are our sequence-parallel-aware RMSNorm (norm.py), in the
parameter dtype. The layer class is megatron's, entering the config's autocast itself (AutocastLayer)
so that recomputed layers run in the same dtypes.
Where the recipe keeps SwiGLU's input in FP8, FC1 applies SwiGLU itself and the MLP's activation is
the identity module of fp8_swiglu.py; megatron applies a spec'd activation only with
`use_te_activation_func` set in the TransformerConfig (qwen.build_gpt sets it).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

from infir.fp8 import Recipe
from infir.model.attention import CoreAttention
from infir.model.fp8_linears import Fp8ColumnLinear, Fp8RowLinear
from infir.model.fp8_swiglu import SwiGLUInFc1
from infir.model.linears import ColumnLinear, RowLinear
from infir.model.norm import RMSNorm


class AutocastLayer(TransformerLayer):
    """megatron's TransformerLayer, run under the config's autocast (`enable_autocast`,
    `autocast_dtype`) from inside. Why: activation recomputation (megatron's CheckpointFunction)
    re-runs layers in the backward, outside the trainer's autocast, and with FP32 master weights the
    recomputed projections then met BF16 activations (a dtype error). The context here applies to the
    first run and to the recomputed one alike; nested in the trainer's own, it changes nothing else."""

    def forward(self, *args, **kwargs):
        if not self.config.enable_autocast:
            return super().forward(*args, **kwargs)
        x = args[0] if args else kwargs["hidden_states"]
        with torch.autocast(device_type=x.device.type, dtype=self.config.autocast_dtype):
            return super().forward(*args, **kwargs)


@dataclass(frozen=True)
class Projections:
    """Which module runs each projection (a class or a ModuleSpec), and the MLP's activation module
    (None: megatron's own SwiGLU). Column-parallel: QKV and FC1; row-parallel: proj and FC2."""

    qkv: object = ColumnLinear
    fc1: object = ColumnLinear
    proj: object = RowLinear
    fc2: object = RowLinear
    activation: object = None


def projections(recipe: Recipe | None = None) -> Projections:
    """The projections of a precision recipe: megatron's high-precision linears, or the FP8 ones with
    the recipe as their ModuleSpec param."""
    if recipe is None or not recipe.fp8:
        return Projections()
    column = ModuleSpec(module=Fp8ColumnLinear, params={"recipe": recipe})
    row = ModuleSpec(module=Fp8RowLinear, params={"recipe": recipe})
    if recipe.swiglu_input is None:
        return Projections(column, column, row, row)
    fc1 = ModuleSpec(module=Fp8ColumnLinear, params={"recipe": recipe, "swiglu_epilogue": True})
    return Projections(column, fc1, row, row, ModuleSpec(module=SwiGLUInFc1))


def layer_spec(proj: Projections = Projections(), attention: str = "auto") -> ModuleSpec:
    """One layer; `attention` is CoreAttention's kernel for packed documents (attention.KERNELS)."""
    return ModuleSpec(
        module=AutocastLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=RMSNorm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=proj.qkv,
                    core_attention=ModuleSpec(module=CoreAttention, params={"kernel": attention}),
                    linear_proj=proj.proj,
                    q_layernorm=IdentityOp,
                    k_layernorm=IdentityOp,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=RMSNorm,
            mlp=ModuleSpec(
                module=MLP,
                submodules=MLPSubmodules(linear_fc1=proj.fc1, linear_fc2=proj.fc2, activation_func=proj.activation),
            ),
            mlp_bda=get_bias_dropout_add,
        ),
    )


def block_spec(num_layers: int, proj: Projections = Projections(), attention: str = "auto") -> TransformerBlockSubmodules:
    """All layers plus the final norm (megatron's default final norm would be its SP-refusing torch norm)."""
    return TransformerBlockSubmodules(layer_specs=[layer_spec(proj, attention)] * num_layers, layer_norm=RMSNorm)
