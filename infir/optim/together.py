"""Several optimizers stepped as one: torch Adam/AdamW instances (the `adamw` entry) of the same settings
in one call of torch's functional Adam per distinct group setting, so their parameters share its multi-tensor
(or fused) kernels; any other optimizer steps alone.

Why: a sharded trainer keeps one optimizer per gradient bucket (its states cut as the bucket is), and dozens
of `step()` calls, each a few small kernels behind a fraction of a millisecond of Python, leave the GPU
waiting on the host at the end of every step. torch has no public call that steps several optimizers
together; this one gathers each optimizer's lists as its own `step()` does (`Adam._init_group`, which also
makes a parameter's states on its first step) and hands them to the same functional `adam`, so the update is
the one each `step()` would make, element for element.
"""
from __future__ import annotations

import torch
from torch.optim.adam import adam

# the group settings one functional call takes as scalars: groups that differ in any of them step apart
_SETTINGS = ("lr", "betas", "weight_decay", "eps", "amsgrad", "maximize", "foreach", "capturable", "differentiable",
             "fused", "decoupled_weight_decay")


def _batchable(o: torch.optim.Optimizer) -> bool:
    """torch's own Adam or AdamW (not a subclass, whose step may differ), from a torch whose AdamW is Adam with
    decoupled weight decay (the functional call this module makes)."""
    return type(o) in (torch.optim.Adam, torch.optim.AdamW) and "decoupled_weight_decay" in o.defaults


def step_together(optimizers: list[torch.optim.Optimizer]) -> None:
    """`opt.step()` for each of `optimizers`, the torch Adam ones batched (their `grad_scale` and `found_inf`
    attributes, the fused kernel's, must then be the same objects)."""
    batched = [o for o in optimizers if _batchable(o)]
    for o in optimizers:
        if not _batchable(o):
            o.step()
    if not batched:
        return
    scale, found = (getattr(batched[0], a, None) for a in ("grad_scale", "found_inf"))
    if any(getattr(o, "grad_scale", None) is not scale or getattr(o, "found_inf", None) is not found for o in batched):
        raise ValueError("step_together: the Adam optimizers carry different grad_scale or found_inf tensors")
    lists: dict[tuple, list] = {}
    with torch.no_grad():
        for o in batched:
            for group in o.param_groups:
                key = tuple(group[k] if k != "lr" or not torch.is_tensor(group[k]) else id(group[k]) for k in _SETTINGS)
                entry = lists.setdefault(key, [group, [[] for _ in range(6)], False])
                entry[2] |= o._init_group(group, *entry[1])
        for group, (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps), has_complex in lists.values():
            if not params:
                continue
            beta1, beta2 = group["betas"]
            adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, amsgrad=group["amsgrad"],
                 has_complex=has_complex, beta1=beta1, beta2=beta2, lr=group["lr"],
                 weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"],
                 foreach=group["foreach"], capturable=group["capturable"], differentiable=group["differentiable"],
                 fused=group["fused"], grad_scale=scale, found_inf=found,
                 decoupled_weight_decay=group["decoupled_weight_decay"])
