"""The peer bar of bench/step.py: HF transformers' Qwen2ForCausalLM at one of our sizes, trained the
way the peer bar is defined (per-layer torch.compile, BF16 autocast over FP32 master weights,
fused AdamW, SDPA attention), in BF16 or with torchao's float8 training on the block
linears (`hf_torchao_tensorwise`, the peer our blockwise FP8 is held against; LM head and
embedding stay BF16 as in ours). Synthetic tokens; one fixed batch, since only speed is read.
"""
from __future__ import annotations

import dataclasses

import torch

HF_PRECISIONS = ("hf_bf16", "hf_torchao_tensorwise")


def build_hf_model(size, precision: str, device: torch.device, compile_layers: bool = True) -> torch.nn.Module:
    from transformers import Qwen2ForCausalLM

    from infir.model.hf_config import hf_config

    if precision not in HF_PRECISIONS:
        raise ValueError(f"unknown HF peer precision {precision!r}; one of {', '.join(HF_PRECISIONS)}")
    with torch.device(device):
        model = Qwen2ForCausalLM(hf_config(size, attn_implementation="sdpa"))
    if precision == "hf_torchao_tensorwise":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = Float8LinearConfig.from_recipe_name("tensorwise")
        if device.type != "cuda":  # FP8 GEMMs need a GPU; torchao emulates them elsewhere (tests)
            config = dataclasses.replace(config, emulate=True)
        convert_to_float8_training(model.model, config=config)  # the decoder only: not the LM head
    if compile_layers:
        for layer in model.model.layers:
            layer.compile()
    return model


class HfTrainer:
    """A training step of the HF peer: `accum` micro-batches of `mbs` x `seq` tokens, then AdamW."""

    def __init__(self, size, precision: str, *, seq: int, mbs: int, accum: int, device, compile_layers: bool = True,
                 lr: float = 1e-4, seed: int = 0):
        self.device = torch.device(device)
        torch.manual_seed(seed)
        self.model = build_hf_model(size, precision, self.device, compile_layers)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, fused=self.device.type == "cuda")
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.ids = torch.randint(size.vocab, (mbs, seq), generator=g).to(self.device)
        self.accum = accum
        self.tokens_per_step = mbs * seq * accum

    def train_step(self) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        for _ in range(self.accum):
            with torch.autocast(self.device.type, dtype=torch.bfloat16):
                # use_cache=False: a KV cache made in training recompiles every compiled layer per
                # layer index until dynamo's recompile limit sends the rest of the model to eager.
                loss = self.model(input_ids=self.ids, labels=self.ids, use_cache=False).loss
            (loss / self.accum).backward()
            total += loss.detach() / self.accum
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return total
