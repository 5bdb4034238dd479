"""The transformer-layer spec of infir's Qwen2.5 models, as a megatron-core ModuleSpec tree.

Megatron stays unmodified: this function returns the same tree as megatron's local GPT spec
(TransformerLayer -> SelfAttention(linear_qkv, core_attention, linear_proj) -> MLP(linear_fc1,
linear_fc2)) with two substitutions — core attention through SDPA (see attention.py), and the four
projection classes taken from `linears`, which is where a precision recipe (infir.fp8) swaps in its
FP8 linears. Norms are our sequence-parallel-aware RMSNorm (norm.py), in the parameter dtype. The
layer class is megatron's, entering the config's autocast itself (AutocastLayer) so that recomputed
layers run in the same dtypes.
`swiglu`, where a recipe gives one, is the MLP's activation module (fp8_swiglu.py); megatron applies
it only with `use_te_activation_func` set in the TransformerConfig (qwen.build_gpt sets it).
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

from infir.model.attention import SDPAttention
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
class LinearClasses:
    """Which module runs each projection. Column-parallel: QKV and FC1; row-parallel: proj and FC2.
    fc1: FC1's own class where it differs from QKV's (an FP8 FC1 that applies SwiGLU itself)."""

    column: type = ColumnLinear
    row: type = RowLinear
    fc1: type | None = None


def layer_spec(linears: LinearClasses = LinearClasses(), swiglu: ModuleSpec | None = None) -> ModuleSpec:
    return ModuleSpec(
        module=AutocastLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=RMSNorm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=linears.column,
                    core_attention=SDPAttention,
                    linear_proj=linears.row,
                    q_layernorm=IdentityOp,
                    k_layernorm=IdentityOp,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=RMSNorm,
            mlp=ModuleSpec(
                module=MLP,
                submodules=MLPSubmodules(linear_fc1=linears.fc1 or linears.column, linear_fc2=linears.row,
                                         activation_func=swiglu),
            ),
            mlp_bda=get_bias_dropout_add,
        ),
    )


def block_spec(num_layers: int, linears: LinearClasses = LinearClasses(), swiglu: ModuleSpec | None = None
               ) -> TransformerBlockSubmodules:
    """All layers plus the final norm (megatron's default final norm would be its SP-refusing torch norm)."""
    return TransformerBlockSubmodules(layer_specs=[layer_spec(linears, swiglu)] * num_layers, layer_norm=RMSNorm)
