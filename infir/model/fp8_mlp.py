"""megatron's MLP whose FC1 -> SwiGLU -> FC2 runs as one fused FP8 Function (infir.fp8.mlp).

Why: the fused Function never writes SwiGLU's output or its input gradient in BF16 (their FP8
operands come straight out of SwiGLU's kernels), which is most of what the FP8 step spent quantizing.

Same modules, parameters and checkpoint keys as megatron's MLP: linear_fc1 / linear_fc2 are our FP8
column/row linears, the activation our FP8-input SwiGLU. Only `forward` changes, and only when the
fused Function computes exactly what the three modules would (`_fused_ok`); otherwise, e.g. on the FP8
health monitor's steps (it records each linear's operands), under sequence parallelism (FC1's FP8
all-gather lives in its own module), with biases, or in a compiled layer without the weight-refresh
hook, megatron's forward runs the modules one by one.

Tensor parallelism as megatron's column/row linears apply it: FC1's input enters the TP region
(identity forward, all-reduce of dX backward) and FC2's partial sums are all-reduced.
"""
from __future__ import annotations

import torch
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
)
from megatron.core.transformer.mlp import MLP

from infir.fp8.mlp import fp8_swiglu_mlp, fusable
from infir.model.fp8_linears import _Fp8, activation_dtype
from infir.model.fp8_swiglu import Fp8InputSwiGLU


class Fp8FusedMLP(MLP):
    def _fused_ok(self, per_token_scale) -> bool:
        fc1, fc2 = self.linear_fc1, self.linear_fc2
        if not (isinstance(fc1, _Fp8) and isinstance(fc2, _Fp8) and isinstance(self.activation_func, Fp8InputSwiGLU)):
            return False
        if torch.compiler.is_compiling() and not (fc1.weight_refreshed and fc2.weight_refreshed):
            return False
        return (per_token_scale is None and self.config.gated_linear_unit and fusable(fc1.fp8_recipe)
                and fc1.fp8_recipe == fc2.fp8_recipe and fc1.bias is None and fc2.bias is None
                and not fc1.sequence_parallel and not fc2.explicit_expert_comm
                and not any(m.monitor is not None and m.monitor.active for m in (fc1, fc2)))

    def forward(self, hidden_states, per_token_scale=None, **kwargs):
        if not self._fused_ok(per_token_scale):
            return super().forward(hidden_states, per_token_scale, **kwargs)
        fc1, fc2 = self.linear_fc1, self.linear_fc2
        x = hidden_states
        if not fc1.disable_grad_reduce:
            x = copy_to_tensor_model_parallel_region(x, group=fc1.tp_group)
        x = activation_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            out = fp8_swiglu_mlp(x, fc1.weight, fc1.fp8_weight(), fc2.weight, fc2.fp8_weight(), fc1.fp8_recipe)
        return reduce_from_tensor_model_parallel_region(out, group=fc2.tp_group), None
