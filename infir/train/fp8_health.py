"""Live FP8 health: every `interval` steps, per FP8 layer, how its quantized operands fare.

For each FP8 linear and operand (x: its input — for linear_fc2 that is the SwiGLU output — w: the
weight, dy: the output gradient) the monitor records the amax, the fraction of values saturated at
the format's max, the fraction of non-zero values flushed to zero, and the quantization SNR (MOSS
Eq. 4), using the layer's own recipe granularity. It warns on the console when an operand drifts:
amax grown past `amax_growth` x its first reading (LLMQ A.4 saw SwiGLU outliers grow in long FP8
runs), saturation above `max_saturated`, or SNR below `min_snr_db`.
"""
from __future__ import annotations

import math

import torch

from infir.fp8 import Fp8SwiGLUOutput, QTensor, dequantize, quant_stats, quantize
from infir.fp8.ops import gemm_granularity


class HealthMonitor:
    """Attaches to a model's FP8 linears as forward hooks (attach) and reads, on every `interval`-th
    step, the first micro-batch's operands of each. Off-interval steps cost one flag test per linear,
    which a compiled layer resolves at trace time (a guard), so it adds nothing to its graph."""

    def __init__(self, interval: int, *, amax_growth: float = 8.0, max_saturated: float = 1e-3, min_snr_db: float = 15.0):
        self.interval = interval
        self.amax_growth, self.max_saturated, self.min_snr_db = amax_growth, max_saturated, min_snr_db
        self.active = False
        self.names: list[str] = []
        self.stats: dict[str, dict] = {}
        self.baseline: dict[str, float] = {}

    def attach(self, model: torch.nn.Module) -> int:
        from infir.model.fp8_linears import Fp8Projection

        for name, module in model.named_modules():
            if isinstance(module, Fp8Projection):
                short = name.replace("decoder.layers.", "L").replace("self_attention.", "").replace("mlp.", "")
                module.register_forward_hook(self._hook(short))
                self.names.append(short)
        return len(self.names)

    def _hook(self, name: str):
        def hook(module, args, output):
            if self.active:
                self.record(name, module, args[0], output[0] if isinstance(output, tuple) else output)
        return hook

    def begin_step(self, step: int) -> None:
        self.active = bool(self.names) and self.interval > 0 and step % self.interval == 0
        self.stats = {}

    @torch.compiler.disable
    @torch.no_grad()
    def record(self, name: str, module, x, y) -> None:
        """The operands of one FP8 linear call: its input x (FC2's arrives already in FP8 from FC1's SwiGLU
        epilogue: its stats are then of those FP8 values), its weight, and the gradient reaching its output
        (none for FC1 with the SwiGLU epilogue, whose output gradient is SwiGLU's, not FC1's)."""
        if f"{name}/x" in self.stats:  # first micro-batch of the step only
            return
        recipe = module.recipe
        if isinstance(x, Fp8SwiGLUOutput):
            fmt = recipe.input
            x = dequantize(QTensor(x.q, x.scale, gemm_granularity(fmt.granularity), fmt.scale_format, fmt.fmt))
        self._add(f"{name}/x", x.detach().reshape(-1, x.shape[-1]), recipe.input)
        self._add(f"{name}/w", module.weight.detach(), recipe.weight)
        if isinstance(y, torch.Tensor) and y.requires_grad:
            y.register_hook(lambda g: self._add(f"{name}/dy", g.detach().reshape(-1, g.shape[-1]), recipe.grad_output))

    @torch.no_grad()
    def _add(self, key: str, t: torch.Tensor, fmt) -> None:
        if key in self.stats:
            return
        q = quantize(t, fmt.granularity, fmt.scale_format, fmt.fmt)
        if q.granularity == "two_level" or q.data.shape != t.shape:
            t = t[..., : q.data.shape[-1]]
        self.stats[key] = quant_stats(t, q)

    def end_step(self, step: int) -> tuple[dict, list[str]]:
        """(flat metrics for the logger, warning lines) of the step just finished."""
        if not self.active:
            return {}, []
        self.active = False
        flat, warnings = {}, []
        for key, s in self.stats.items():
            for stat, value in s.items():
                flat[f"fp8/{key}/{stat}"] = value
            base = self.baseline.setdefault(key, s["amax"])
            if base > 0 and s["amax"] > self.amax_growth * base:
                warnings.append(f"{key}: amax {s['amax']:.3g} grew {s['amax'] / base:.1f}x since step of first reading")
            if s["saturated"] > self.max_saturated:
                warnings.append(f"{key}: {100 * s['saturated']:.3f}% of values saturate the FP8 range")
            if math.isfinite(s["snr_db"]) and s["snr_db"] < self.min_snr_db:
                warnings.append(f"{key}: quantization SNR {s['snr_db']:.1f} dB")
        swiglu = [s["amax"] for k, s in self.stats.items() if "linear_fc2/x" in k]
        if swiglu:
            flat["fp8/swiglu_amax_max"] = max(swiglu)
        snrs = [s["snr_db"] for s in self.stats.values() if math.isfinite(s["snr_db"])]
        if snrs:
            flat["fp8/snr_db_min"] = min(snrs)
        flat["fp8/saturated_max"] = max((s["saturated"] for s in self.stats.values()), default=0.0)
        return flat, warnings
