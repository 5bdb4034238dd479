"""Model FLOPs per token and MFU.

Training FLOPs per token = 6 x (weights of every matmul: Q/K/V/O, MLP, LM head) + 6 x layers x hidden
x seq (causal attention: QK^T and PV over half the square). This is the accounting behind the HF BF16
bar in our docs: Qwen2.5-1.5B at seq 4096 gives 10.31 GFLOP/token, and 43.3k tok/s x 10.31 GFLOP =
446 TFLOP/s. Embedding lookups, norms and the loss are not counted (they are not matmuls).
"""
from __future__ import annotations

import torch

from infir.model.qwen import QwenSize

# Dense BF16 spec peaks (TFLOP/s), by device-name fragment; FP8 recipes are still scored against BF16's
# peak so that FP8 and BF16 MFU compare like for like.
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "A100": 312.0, "L40S": 362.0, "4090": 165.0}


def matmul_params(size: QwenSize) -> int:
    d, kv = size.hidden, size.kv_heads * size.head_dim
    per_layer = d * (d + 2 * kv) + d * d + 3 * d * size.ffn
    return size.layers * per_layer + size.vocab * d


def flops_per_token(size: QwenSize, seq_length: int) -> float:
    return 6.0 * matmul_params(size) + 6.0 * size.layers * size.hidden * seq_length


def megatron_lm_flops_per_token(size: QwenSize, seq_length: int) -> float:
    """Training FLOPs per token as Megatron-LM counts them (`num_floating_point_operations` in
    megatron/training/training.py, after Narayanan et al. 2021, appendix "Floating-point operations"),
    the count behind TFLOP/s figures of Megatron-based reports such as InfiR2's: 12 x layers x hidden^2
    x [(1 + kv_heads/heads + seq/hidden) x (heads x head_dim / hidden) + 3/2 x ffn/hidden (SwiGLU)
    + vocab / (2 x layers x hidden)]. It counts the whole [s, s] score square (no causal half), so at
    32k it is well above `flops_per_token`; compare like with like."""
    d, L = size.hidden, size.layers
    q_ratio = size.heads * size.head_dim / d
    attention = (1 + size.kv_heads / size.heads + seq_length / d) * q_ratio
    return 12.0 * L * d * d * (attention + 1.5 * size.ffn / d + size.vocab / (2 * L * d))


def peak_tflops(device: torch.device) -> float | None:
    """The device's dense BF16 peak, or None where unknown (CPU): MFU is then not reported."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_TFLOPS.items():
        if key in name:
            return peak
    return None
