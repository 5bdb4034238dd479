"""FlashAdamW (FlashOptim §3, Algorithms 1-4; shared/seeds/001): AdamW at ~7 bytes per parameter.

Per parameter, for bf16 weights:
  weight      bf16, 2 B   the model's own parameter (no separate fp32 copy)
  correction  int8, 1 B   ULP-normalised rounding error of the fp32 master (weight_split.py)
  exp_avg     int8, 1 B   + fp16 scale per 32 (softsign companding, companding.py)
  exp_avg_sq  uint8, 1 B  + fp16 scale per 32 (sqrt companding)
  gradient    bf16, 2 B   (0 B with gradient release: release.py)
= 7.125 B with 16-bit gradients, 5.125 B with release, against 16 B for fp32 master + fp32 Adam.
fp32 parameters are accepted too: they are their own master, so they carry no correction.

Each step decodes master and states to fp32, runs AdamW (adam_math.adamw_fp32), and encodes
them again. On CUDA one Triton kernel does all of it (flash_adamw_triton.py); elsewhere
``flash_adamw_reference`` does, with the same op order, so both give the same bits. Checkpoints
hold the compressed tensors: 5.125 B per parameter (§3.4), and load back bit for bit.
"""
from typing import Optional

import torch

from infir.optim import companding, weight_split
from infir.optim.adam_math import AdamScalars, adamw_fp32
from infir.optim.base import PerParamOptimizer, shard_of


def flash_adamw_reference(param: torch.Tensor, grad: torch.Tensor,
                          correction: Optional[torch.Tensor], m_codes: torch.Tensor,
                          m_scales: torch.Tensor, v_codes: torch.Tensor, v_scales: torch.Tensor,
                          s: AdamScalars) -> dict[str, torch.Tensor]:
    """One FlashAdamW step in plain PyTorch; returns the new tensors (inputs are not modified):
    param, correction (None for fp32 params), m_codes, m_scales, v_codes, v_scales."""
    if correction is None:
        master = param.float()
    else:
        master = weight_split.merge_master(param, correction)
    m = companding.dequantize_momentum(m_codes, m_scales)
    v = companding.dequantize_variance(v_codes, v_scales)
    master, m, v = adamw_fp32(master, grad.float(), m, v, s)
    if correction is None:
        new_param, new_corr = master.to(param.dtype), None
    else:
        new_param, new_corr = weight_split.split_master(master)
    m_codes, m_scales = companding.quantize_momentum(m)
    v_codes, v_scales = companding.quantize_variance(v)
    return dict(param=new_param, correction=new_corr, m_codes=m_codes, m_scales=m_scales,
                v_codes=v_codes, v_scales=v_scales)


def _use_triton(p: torch.Tensor) -> bool:
    if not p.is_cuda:
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


class FlashAdamW(PerParamOptimizer):
    """AdamW with split bf16 master weights and companded 8-bit states.

    Arguments and defaults are torch.optim.AdamW's. Params: bf16 (the intended use: the model is
    cast to bf16 once, and the optimizer keeps the extra 8 bits of master precision) or fp32.
    ``fused=None`` picks the Triton kernel for CUDA params and the PyTorch twin otherwise.
    """

    STATE_KEYS = ("correction", "m_codes", "m_scales", "v_codes", "v_scales")
    GROUPED_STATES = {"m_scales": companding.GROUP, "v_scales": companding.GROUP}  # one per group of elements

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, *, fused: Optional[bool] = None,
                 offload: bool = False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay),
                         offload=offload)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype not in (torch.bfloat16, torch.float32):
                    raise TypeError(f"FlashAdamW keeps bf16 or fp32 params, got {p.dtype} "
                                    f"for a param of shape {tuple(p.shape)}")
        self.fused = fused

    def _init_state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        if shard_of(p).offset % companding.GROUP:
            # the states' scale groups would straddle two ranks and differ from the unsharded run's
            raise ValueError(f"a FlashAdamW shard must start at a multiple of {companding.GROUP} elements of its "
                             f"parameter, got offset {shard_of(p).offset}; pad the shards to that multiple")
        n_groups = companding.num_groups(p.numel())
        state = dict(
            m_codes=torch.zeros_like(p, dtype=torch.int8),
            m_scales=torch.zeros(n_groups, dtype=torch.float16, device=p.device),
            v_codes=torch.zeros_like(p, dtype=torch.uint8),
            v_scales=torch.zeros(n_groups, dtype=torch.float16, device=p.device),
        )
        if p.dtype == torch.bfloat16:
            # the bf16 weight is the master's exact rounding at start: correction 0
            state["correction"] = torch.zeros_like(p, dtype=torch.int8)
        return state

    def _update(self, p: torch.Tensor, grad: torch.Tensor, state: dict, group: dict,
                s: AdamScalars, seed: int) -> None:
        fused = _use_triton(p) if self.fused is None else self.fused
        if fused:
            from infir.optim.flash_adamw_triton import flash_adamw_triton_
            flash_adamw_triton_(p, grad, state.get("correction"), state["m_codes"],
                                state["m_scales"], state["v_codes"], state["v_scales"], s)
            return
        out = flash_adamw_reference(p, grad, state.get("correction"), state["m_codes"],
                                    state["m_scales"], state["v_codes"], state["v_scales"], s)
        p.copy_(out.pop("param"))
        for key, value in out.items():
            if value is not None:
                state[key].copy_(value)

    @staticmethod
    def requantized(elements: dict[str, torch.Tensor], key: str) -> dict[str, torch.Tensor]:
        """m or v quantized afresh in groups of 32 from its codes decoded with per-element scales: for a
        parameter cut otherwise than when saved (another tensor-parallel size), where a group gathers
        elements that were quantized with different scales; one more 8-bit rounding of those groups."""
        if key == "m_scales":
            m = companding.momentum_unit(elements["m_codes"]) * elements["m_scales"].float()
            codes, scales = companding.quantize_momentum(m)
            return {"m_codes": codes, "m_scales": scales}
        root = companding.variance_unit(elements["v_codes"]) * elements["v_scales"].float()
        codes, scales = companding.quantize_variance(root * root)
        return {"v_codes": codes, "v_scales": scales}

    def master_weight(self, p: torch.Tensor) -> torch.Tensor:
        """The fp32 master weight of ``p`` (bf16 + correction), e.g. to export fp32 weights."""
        corr = self.state.get(p, {}).get("correction")
        return p.detach().float() if corr is None else weight_split.merge_master(p.detach(), corr)

    def dequantized_states(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(exp_avg, exp_avg_sq) of ``p`` in fp32."""
        st = self.state[p]
        return (companding.dequantize_momentum(st["m_codes"], st["m_scales"]),
                companding.dequantize_variance(st["v_codes"], st["v_scales"]))
