"""AdamW with bf16 weights and bf16 states, fp32 math inside the step, and stochastic rounding
on write-back (talk shared/seeds/004 slides 15-18; LLMQ §3.1). 8 bytes per parameter with bf16
gradients, half of fp32 master + fp32 Adam.

Why the rounding matters: an AdamW update is often far below half a bf16 ULP of the weight
(lr 1e-4 on a weight of 0.1 moves it by ~1e-4; the bf16 ULP there is 5e-4). Round-to-nearest
drops every such update, so training stalls (``BF16AdamW``, the failing baseline kept for
the tests and benchmarks). Stochastic rounding rounds up with probability equal to the dropped
fraction: unbiased, so small updates survive in expectation.

The random bits come from (seed, step, parameter index) and the element's place in the parameter,
identical on every data-parallel rank: replicas that see the same all-reduced gradient stay
bit-identical, and a rank stepping a shard of the parameter draws that part of the same bits.
"""
from typing import Optional

import torch

from infir.optim.adam_math import AdamScalars, adamw_fp32
from infir.optim.base import PerParamOptimizer, shard_of


def round_to_bf16_stochastic(x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16, rounding up with probability (dropped bits) / 2**16. ``noise``: int32 in
    [0, 2**16), one per element. Adding it to the 16 bits that bf16 drops carries into the kept
    bits exactly that often; on sign-magnitude floats this rounds the magnitude, so it is unbiased
    for either sign."""
    bits = x.float().view(torch.int32)
    return ((bits + noise) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def sr_noise(shape, seed: int, device) -> torch.Tensor:
    """Three int32 noise tensors (weight, exp_avg, exp_avg_sq) in [0, 2**16), from ``seed``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return torch.randint(0, 1 << 16, (3, *shape), generator=gen, device=device, dtype=torch.int32)


def sr_adamw_reference(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                       exp_avg_sq: torch.Tensor, s: AdamScalars,
                       noise: Optional[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """One step on bf16 tensors in fp32; returns new bf16 (param, exp_avg, exp_avg_sq).
    ``noise`` (3, *shape) int32 selects stochastic rounding; None rounds to nearest."""
    p, m, v = adamw_fp32(param.float(), grad.float(), exp_avg.float(), exp_avg_sq.float(), s)
    if noise is None:
        return p.to(torch.bfloat16), m.to(torch.bfloat16), v.to(torch.bfloat16)
    return tuple(round_to_bf16_stochastic(t, n) for t, n in zip((p, m, v), noise))


class SRAdamW(PerParamOptimizer):
    """AdamW over bf16 params with bf16 exp_avg / exp_avg_sq and stochastic rounding.

    Arguments and defaults are torch.optim.AdamW's, plus ``seed`` for the rounding noise and
    ``offload`` (states in pinned host memory, offload.py). ``fused=None`` uses the Triton kernel
    on CUDA and the PyTorch twin elsewhere."""

    stochastic = True

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, *, seed: int = 0,
                 fused: Optional[bool] = None, offload: bool = False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay),
                         offload=offload, seed=seed)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype != torch.bfloat16:
                    raise TypeError(f"{type(self).__name__} updates bf16 params, got {p.dtype} for "
                                    f"a param of shape {tuple(p.shape)}; cast the model with "
                                    ".bfloat16() or use FlashAdamW / torch AdamW")
        self.fused = fused

    def _init_state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        return dict(exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))

    def _update(self, p, grad, state, group, s, seed) -> None:
        fused = (p.is_cuda if self.fused is None else self.fused)
        shard = shard_of(p)
        if fused:
            from infir.optim.sr_adamw_triton import sr_adamw_triton_
            sr_adamw_triton_(p, grad, state["exp_avg"], state["exp_avg_sq"], s,
                             seed if self.stochastic else None, offset=shard.offset)
            return
        noise = None
        if self.stochastic:
            # the whole parameter's noise, of which this shard takes its own elements' share
            noise = sr_noise((shard.whole_numel,), seed, p.device)[:, shard.offset:shard.offset + p.numel()]
            noise = noise.reshape(3, *p.shape)
        new = sr_adamw_reference(p, grad, state["exp_avg"], state["exp_avg_sq"], s, noise)
        for dst, src in zip((p, state["exp_avg"], state["exp_avg_sq"]), new):
            dst.copy_(src)


class BF16AdamW(SRAdamW):
    """The failing baseline: bf16 params and states, round-to-nearest write-back. Kept to show
    (tests, benchmarks) what stochastic rounding and split master weights fix."""

    stochastic = False
