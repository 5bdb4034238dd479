"""The AdamW update in fp32, shared by every optimizer here and written in the exact op order of
the fused kernels, so that each kernel has a bit-exact plain-PyTorch twin.

Hyper-parameters enter the kernels as fp32 scalars; ``AdamScalars`` rounds them the same way
(bias corrections are computed once per step on the host instead of once per element)."""
from dataclasses import dataclass

import numpy as np
import torch


def _f32(x) -> float:
    return float(np.float32(x))


@dataclass(frozen=True)
class AdamScalars:
    """fp32-rounded scalars of one AdamW step (decoupled weight decay, as torch.optim.AdamW)."""
    lr: float
    beta1: float
    beta2: float
    one_minus_beta1: float
    one_minus_beta2: float
    eps: float
    decay: float  # 1 - lr * weight_decay
    bias_correction1: float
    bias_correction2: float

    @classmethod
    def of(cls, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
           step: int) -> "AdamScalars":
        if step < 1:
            raise ValueError(f"AdamW step counts from 1, got {step}")
        b1, b2 = np.float32(beta1), np.float32(beta2)
        # beta**step correctly rounded to fp32 (powf of the fp32 beta), then 1 - it in fp32
        p1 = np.float32(float(b1) ** step)
        p2 = np.float32(float(b2) ** step)
        return cls(lr=_f32(lr), beta1=float(b1), beta2=float(b2),
                   one_minus_beta1=_f32(np.float32(1.0) - b1),
                   one_minus_beta2=_f32(np.float32(1.0) - b2), eps=_f32(eps),
                   decay=_f32(np.float32(1.0) - np.float32(lr * weight_decay)),
                   bias_correction1=_f32(np.float32(1.0) - p1),
                   bias_correction2=_f32(np.float32(1.0) - p2))


def div(x: torch.Tensor, c: float) -> torch.Tensor:
    """x / c rounded as an IEEE division. A Python-scalar divisor lets torch's CUDA kernel
    multiply by 1/c instead, which differs from the kernels' true division in the last bit."""
    return x / torch.full((), c, dtype=x.dtype, device=x.device)


def sqrt_rn(x: torch.Tensor) -> torch.Tensor:
    """fp32 square root rounded to nearest. torch's vectorised CPU sqrt is off by one ulp on some
    inputs; through fp64 the result is the correctly rounded one that the kernels compute."""
    return x.double().sqrt().to(x.dtype)


def adamw_fp32(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
               s: AdamScalars) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One AdamW step on fp32 tensors; returns new (p, m, v). Separate mul and add (no fused
    multiply-add) so the kernels, built with fp fusion off, agree to the bit."""
    m = m * s.beta1 + g * s.one_minus_beta1
    v = v * s.beta2 + g * g * s.one_minus_beta2
    p = p * s.decay
    denom = sqrt_rn(div(v, s.bias_correction2)) + s.eps
    p = p - (div(m, s.bias_correction1) * s.lr) / denom
    return p, m, v
