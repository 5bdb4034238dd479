"""Generation backends: prompts (chat-templated text) -> n completions each.

- `VLLMBackend`: vLLM's offline `LLM.generate` (GPU, tensor parallel, continuous batching). The
  engine and its SamplingParams class can be passed in, which is how tests run this path without
  vLLM (a fake engine with vLLM's `generate(prompts, params) -> [RequestOutput]` shape).
- `HFBackend`: `transformers` `generate` with left padding, on CPU or GPU, for hosts without vLLM. Block-FP8
  checkpoints (`infir-convert mcore-to-hf --fp8`, DeepSeek-V3's and Qwen3's FP8 releases) load through
  transformers' FineGrainedFP8 (`_fp8_load_kwargs`).
`make_backend("auto", ...)` picks vLLM when it is importable and a GPU is present.
"""
from __future__ import annotations

import importlib.util
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from infir.eval.benchmarks import Sampling


@dataclass(frozen=True)
class Completion:
    text: str
    num_tokens: int
    finish_reason: str  # "stop" (ended by an end token) or "length" (ran out of max_new_tokens)


class GenerationBackend(Protocol):
    def generate(self, prompts: list[str], sampling: Sampling, seed: int) -> list[list[Completion]]:
        """For each prompt, `sampling.n` completions."""


class VLLMBackend:
    def __init__(self, model_dir: str | Path, tensor_parallel_size: int = 1, engine=None,
                 sampling_params_cls=None, **engine_kwargs):
        if engine is None or sampling_params_cls is None:
            try:
                import vllm
            except ImportError as e:
                raise ImportError("backend=vllm needs vLLM: `pip install 'infir[vllm]'`, or use backend.name=hf") from e
            engine = engine or vllm.LLM(model=str(model_dir), tensor_parallel_size=tensor_parallel_size, **engine_kwargs)
            sampling_params_cls = sampling_params_cls or vllm.SamplingParams
        self.engine, self.sampling_params_cls = engine, sampling_params_cls

    def generate(self, prompts: list[str], sampling: Sampling, seed: int) -> list[list[Completion]]:
        params = self.sampling_params_cls(n=sampling.n, temperature=sampling.temperature, top_p=sampling.top_p,
                                          max_tokens=sampling.max_new_tokens, seed=seed)
        outputs = self.engine.generate(prompts, params)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
        return [[Completion(o.text, len(o.token_ids), "length" if o.finish_reason == "length" else "stop")
                 for o in request.outputs] for request in outputs]


def _torch_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


class HFBackend:
    def __init__(self, model_dir: str | Path, tokenizer, device: str = "auto", dtype: str = "auto",
                 batch_size: int = 8):
        from transformers import AutoModelForCausalLM

        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=_torch_dtype(dtype, self.device),
                                                          **_fp8_load_kwargs(model_dir, self.device))
        self.model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size  # sequences per generate call (prompts x samples)
        # Chat models end a turn with <|im_end|> but some configs name only <|endoftext|>: stop at any.
        names = {tokenizer.eos_token, "<|im_end|>", "<|endoftext|>"}
        vocab = tokenizer.get_vocab()
        self.stop_ids = sorted({vocab[t] for t in names if t in vocab} | _as_set(self.model.generation_config.eos_token_id))
        if not self.stop_ids:
            raise ValueError(f"HFBackend: the tokenizer at {model_dir} defines no end-of-turn token; set eos_token")
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.stop_ids[0]

    @torch.inference_mode()
    def generate(self, prompts: list[str], sampling: Sampling, seed: int) -> list[list[Completion]]:
        per_call = max(1, self.batch_size // sampling.n)
        results: list[list[Completion]] = []
        for start in range(0, len(prompts), per_call):
            torch.manual_seed(seed + start)  # each chunk its own stream: a resumed run redraws the same chunk
            batch = prompts[start:start + per_call]
            enc = self.tokenizer(batch, return_tensors="pt", padding=True, padding_side="left",
                                 add_special_tokens=False).to(self.device)
            greedy = sampling.temperature == 0
            out = self.model.generate(
                **enc, do_sample=not greedy, temperature=None if greedy else sampling.temperature,
                top_p=None if greedy else sampling.top_p, top_k=None, max_new_tokens=sampling.max_new_tokens,
                num_return_sequences=sampling.n, eos_token_id=self.stop_ids, pad_token_id=self.pad_id,
            )
            new = out[:, enc["input_ids"].shape[1]:].cpu()
            completions = [self._completion(row, sampling.max_new_tokens) for row in new]
            results += [completions[i * sampling.n:(i + 1) * sampling.n] for i in range(len(batch))]
        return results

    def _completion(self, tokens: torch.Tensor, max_new_tokens: int) -> Completion:
        stops = torch.isin(tokens, torch.tensor(self.stop_ids))
        if stops.any():
            end = int(stops.nonzero()[0])
            return Completion(self.tokenizer.decode(tokens[:end], skip_special_tokens=True), end + 1, "stop")
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return Completion(text, len(tokens), "length" if len(tokens) >= max_new_tokens else "stop")


def _fp8_load_kwargs(model_dir: str | Path, device: str) -> dict:
    """from_pretrained's arguments for a block-FP8 checkpoint. On a GPU transformers runs its FP8 GEMMs
    (activations quantized per 1x128 on the fly) with the `finegrained-fp8` kernel, fetched from the HF
    hub on first use; where that kernel cannot be had (a CPU, an offline GPU host) the weights are
    dequantized as they load: the same FP8 weight values, high-precision activations and GEMMs."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    if (config.get("quantization_config") or {}).get("quant_method") != "fp8":
        return {}
    missing = "no GPU" if not device.startswith("cuda") else fp8_kernel_missing()
    if missing is None:
        return {"device_map": device}
    from transformers import FineGrainedFP8Config

    warnings.warn(f"{model_dir} holds FP8 weights, and transformers' FP8 GEMM cannot run here ({missing}): "
                  "generating with the weights dequantized on load, activations unquantized")
    return {"quantization_config": FineGrainedFP8Config(dequantize=True)}


def fp8_kernel_missing() -> str | None:
    """Why transformers' FP8 GEMM kernel cannot be loaded, or None when it can."""
    from transformers.integrations import finegrained_fp8

    load = getattr(finegrained_fp8, "load_finegrained_fp8_kernel", None)
    if load is None:  # transformers 4.x: FP8 GEMMs in Triton kernels it ships
        return None
    try:
        load()
    # ImportError without the `kernels` package; hub and network errors of its download differ by version
    except Exception as err:  # noqa: BLE001
        return f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    return None


def _as_set(ids) -> set[int]:
    if ids is None:
        return set()
    return set(ids) if isinstance(ids, (list, tuple)) else {int(ids)}


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


def make_backend(name: str, model_dir: Path, tokenizer, *, device: str = "auto", dtype: str = "auto",
                 batch_size: int = 8, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.9,
                 seed: int = 0) -> GenerationBackend:
    if name == "auto":
        name = "vllm" if vllm_available() else "hf"
    if name == "vllm":
        return VLLMBackend(model_dir, tensor_parallel_size=tensor_parallel_size,
                           gpu_memory_utilization=gpu_memory_utilization, seed=seed)
    if name == "hf":
        return HFBackend(model_dir, tokenizer, device=device, dtype=dtype, batch_size=batch_size)
    raise ValueError(f"backend.name must be auto, vllm or hf; got {name!r}")
