"""Memory-efficient AdamW variants with torch.optim's interface.

| name            | class                  | params | bytes/param (weights+grad+states)  |
|-----------------|------------------------|--------|------------------------------------|
| adamw           | torch.optim.AdamW      | fp32   | 16 (fp32 grad), the reference      |
| flash_adamw     | FlashAdamW             | bf16   | 7.125; 5.125 with gradient release |
| sr_adamw        | SRAdamW                | bf16   | 8                                  |
| bf16_adamw_rn   | BF16AdamW              | bf16   | 8, round-to-nearest: the failing baseline |
| offload_adamw   | SRAdamW(offload=True)  | bf16   | 4 on the GPU, 4 in pinned host memory |

Hook-up in a training loop (what each optimizer expects):
- ``optimizer_spec(name)`` says it: the params' dtype, where the gradients are read, whether
  clipping fuses into the step.
- Params: ``param_dtype``; cast the model (``model.bfloat16()``) before building
  the optimizer. The bf16 optimizers keep no fp32 copy: the param *is* the weight.
- Gradients: read from ``p.grad``, or from ``p.main_grad`` when ``p.grad`` is None (megatron-core
  DDP), any float dtype; the math is fp32. torch's AdamW only reads ``p.grad``.
- Data parallel (torch DDP or megatron-core DDP without the distributed optimizer): reduce
  gradients, then ``optimizer.step()`` on every rank; every rank keeps full states and the
  update is deterministic (SR noise is keyed by seed, step and param index, not rank), so
  replicas stay bit-identical (tests/optim/test_data_parallel.py).
- Sharded data parallel (ZeRO-1): build the optimizer over ``shard_view``s, each rank's share of
  the parameters; a shard steps as that part of its whole parameter (same rounding noise, same
  quantization groups; FlashAdamW shards start at multiples of 32 elements), so the sharded run
  equals the replicated one. infir/train/optimizer.py does this over megatron DDP's buffers, one
  optimizer per gradient bucket, stepped together (``step_together``: torch's AdamW instances in one
  functional call, the others one by one).
- Not composable: megatron's DistributedOptimizer (it owns an fp32 master copy and shards
  fp32 Adam states: the memory these optimizers remove) and stepping inside backward under DDP
  (release.py says why).
- Gradient release: ``enable_step_in_backward(optimizer, model)`` (release.py), single GPU.
- Offload: ``offload=True`` on FlashAdamW / SRAdamW (offload.py); call ``optimizer.step()``
  after backward, or combine with ``enable_step_in_backward`` to overlap with backward.
- Checkpoints: ``state_dict()`` / ``load_state_dict()`` round-trip bit for bit.
"""
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from infir.optim.base import PerParamOptimizer, Shard, shard_of, shard_view
from infir.optim.flash_adamw import FlashAdamW
from infir.optim.release import StepInBackward, enable_step_in_backward
from infir.optim.sr_adamw import BF16AdamW, SRAdamW
from infir.optim.together import step_together


def OffloadedAdamW(params, **kw) -> SRAdamW:
    """SRAdamW with its bf16 states in pinned host memory (the talk's recipe)."""
    return SRAdamW(params, offload=True, **kw)


def _torch_adamw(params, **kw) -> torch.optim.AdamW:
    params = list(params)
    kw.setdefault("fused", all(p.is_cuda for p in params if isinstance(p, torch.Tensor)))
    return torch.optim.AdamW(params, **kw)


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer and what it needs from the training loop that steps it."""
    factory: Callable[..., torch.optim.Optimizer]
    param_dtype: torch.dtype  # the dtype the model's params must have
    # True: reads megatron DDP's FP32 `p.main_grad` itself (its BF16 params' `.grad` could not hold it).
    # False: steps on `p.grad`, which the loop points at `main_grad`.
    reads_main_grad: bool
    # Built fused, it divides the gradients by `optimizer.grad_scale` inside its kernel: clipping
    # then costs no pass over the gradients of its own.
    fused_grad_scale: bool = False

    def clips_in_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether setting `optimizer.grad_scale` clips the gradients during `optimizer.step()`."""
        return self.fused_grad_scale and bool(optimizer.defaults.get("fused"))


OPTIMIZERS = {
    "adamw": OptimizerSpec(_torch_adamw, torch.float32, reads_main_grad=False, fused_grad_scale=True),
    "flash_adamw": OptimizerSpec(FlashAdamW, torch.bfloat16, reads_main_grad=True),
    "sr_adamw": OptimizerSpec(SRAdamW, torch.bfloat16, reads_main_grad=True),
    "bf16_adamw_rn": OptimizerSpec(BF16AdamW, torch.bfloat16, reads_main_grad=True),
    "offload_adamw": OptimizerSpec(OffloadedAdamW, torch.bfloat16, reads_main_grad=True),
}


def optimizer_spec(name: str) -> OptimizerSpec:
    """The registry entry of optimizer ``name`` (a key of OPTIMIZERS)."""
    if name not in OPTIMIZERS:
        raise KeyError(f"unknown optimizer {name!r}; choose one of {sorted(OPTIMIZERS)}")
    return OPTIMIZERS[name]


def build_optimizer(name: str, params: Iterable, **kw) -> torch.optim.Optimizer:
    """Build optimizer ``name`` (a key of OPTIMIZERS) with torch AdamW's keyword arguments
    (lr, betas, eps, weight_decay) plus the class's own (fused, offload, seed)."""
    spec = optimizer_spec(name)
    dtype = spec.param_dtype
    params = [dict(item, params=list(item["params"])) if isinstance(item, dict) else item
              for item in params]
    for p in (q for item in params for q in (item["params"] if isinstance(item, dict) else [item])):
        if p.dtype != dtype:
            raise TypeError(f"optimizer {name!r} expects {dtype} params, got {p.dtype} for a "
                            f"param of shape {tuple(p.shape)}; cast the model to {dtype} first")
    return spec.factory(params, **kw)


__all__ = ["FlashAdamW", "SRAdamW", "BF16AdamW", "OffloadedAdamW", "PerParamOptimizer",
           "Shard", "shard_of", "shard_view",
           "StepInBackward", "enable_step_in_backward", "build_optimizer", "step_together",
           "optimizer_spec", "OptimizerSpec", "OPTIMIZERS"]
