"""Optimizer step inside backward (FlashOptim §3.3 "gradient release"; the talk's overlap of the
offloaded step with backward, shared/seeds/004 slide 24).

A post-accumulate-grad hook on each parameter calls ``optimizer.step_param`` as soon as that
gradient is final, then (``release_grads=True``) frees it: at most a few gradients exist at once,
which takes FlashAdamW from 7 to 5 bytes per parameter. With an offloading optimizer the hook only
enqueues H2D -> update -> D2H on side streams, so transfers overlap the rest of backward.

Gradient accumulation: set ``handle.armed = False`` for the micro-batches that only accumulate
and ``True`` for the last one; the hooks then step (and release) during the last backward only.

Does not compose with:
- global gradient-norm clipping: the norm needs every gradient before the first step;
- data-parallel wrappers that reduce gradients after backward hooks (torch DDP, megatron-core
  DDP): the hook would step on the local, un-reduced gradient. ``enable_step_in_backward``
  refuses a DDP-wrapped model and params carrying megatron's ``main_grad``.
"""
import weakref
from typing import Optional

import torch

from infir.optim.base import PerParamOptimizer


class StepInBackward:
    """Handle returned by ``enable_step_in_backward``; ``remove()`` restores plain stepping."""

    def __init__(self, optimizer: PerParamOptimizer, release_grads: bool):
        self.optimizer = optimizer
        self.release_grads = release_grads
        self.armed = True
        self._hooks = []
        # The hooks live on the params (partly in C++, out of the garbage collector's sight):
        # a strong reference from a hook back to the optimizer, its groups or this handle would
        # be a cycle gc cannot free, keeping the model alive. So the hooks hold a weak reference
        # to the optimizer, and the optimizer holds this handle.
        optimizer._step_in_backward = self
        for index, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                if p.requires_grad:
                    self._hooks.append(p.register_post_accumulate_grad_hook(
                        self._hook(weakref.ref(optimizer), index)))

    @staticmethod
    def _hook(optimizer_ref, group_index: int):
        def hook(p: torch.Tensor) -> None:
            optimizer = optimizer_ref()
            handle = getattr(optimizer, "_step_in_backward", None)
            if handle is None or not handle.armed or p.grad is None:
                return
            optimizer.step_param(p, optimizer.param_groups[group_index])
            optimizer._stepped_in_backward.add(p)
            if handle.release_grads:
                p.grad = None
        return hook

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if getattr(self.optimizer, "_step_in_backward", None) is self:
            self.optimizer._step_in_backward = None


def _reduces_after_backward(model: Optional[torch.nn.Module], optimizer) -> Optional[str]:
    if model is not None and "DistributedDataParallel" in type(model).__name__:
        return f"the model is wrapped in {type(model).__module__}.{type(model).__name__}"
    for group in optimizer.param_groups:
        for p in group["params"]:
            if hasattr(p, "main_grad"):
                return "params carry megatron DDP's main_grad buffers"
    return None


def enable_step_in_backward(optimizer: PerParamOptimizer, model: Optional[torch.nn.Module] = None,
                            *, release_grads: bool = True) -> StepInBackward:
    """Step each parameter from its post-accumulate-grad hook. Keep calling
    ``optimizer.step()`` after backward: it steps nothing twice, steps params whose hook did not
    fire, and makes the current stream wait for offloaded updates."""
    if not isinstance(optimizer, PerParamOptimizer):
        raise TypeError(f"step-in-backward needs an infir.optim optimizer with step_param(), got "
                        f"{type(optimizer).__name__}; use flash_adamw, sr_adamw or offload_adamw")
    reason = _reduces_after_backward(model, optimizer)
    if reason is not None:
        raise TypeError(f"cannot step inside backward: {reason}, so gradients are reduced across "
                        "ranks only after the hooks fire and each rank would step on its local "
                        "gradient. Under data parallelism call optimizer.step() after the "
                        "gradient all-reduce instead (no gradient release)")
    return StepInBackward(optimizer, release_grads)
