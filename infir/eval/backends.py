"""Generation backends: prompts (chat-templated text) -> n completions each.

- `VLLMBackend`: vLLM's offline `LLM.generate` (GPU, tensor parallel, continuous batching). The
  engine and its SamplingParams class can be passed in, which is how tests run this path without
  vLLM (a fake engine with vLLM's `generate(prompts, params) -> [RequestOutput]` shape).
- `HFBackend`: a `transformers` model with left padding, on CPU or GPU, for hosts without vLLM: sequences
  batched by prompt length; on a GPU a static KV cache with infir's compiled decode step (decode.py), else
  transformers' `generate`. Block-FP8
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
from infir.eval.decode import StaticDecoder


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
    """A `transformers` model over (prompt, sample) sequences, `batch_size` a call. Sequences are batched
    by prompt length (`sort_by_length`), so a call pads little, and come back in the prompts' order. On a
    GPU the KV cache is static (`cache="static"`) and decode.StaticDecoder runs each token's step, sampling
    included, as one compiled call with CUDA graphs, which removes the per-token host work that bounds a
    small model's decoding; with a dynamic cache, transformers' `generate`.

    Why not transformers' continuous batching (`generate_batch`), the scheduling nearest vLLM's: it has no
    per-request seed, one generator serves whatever shares a decode step, so a sample depends on the
    scheduling and a resumed chunk would not redraw its samples; and its paged cache is another attention
    path than the padded one the CPU tests check against a plain argmax loop. bench/generate.py times it
    beside this path (mode `continuous`)."""

    def __init__(self, model_dir: str | Path, tokenizer, device: str = "auto", dtype: str = "auto",
                 batch_size: int = 8, cache: str = "auto", compile: bool | None = None,
                 sort_by_length: bool = True):
        from transformers import AutoModelForCausalLM

        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        self.cache, self.compile = _cache_and_compile(cache, compile, self.device)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=_torch_dtype(dtype, self.device),
                                                          **_fp8_load_kwargs(model_dir, self.device))
        self.model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size  # sequences per generate call (prompts x samples)
        self.sort_by_length = sort_by_length
        # Chat models end a turn with <|im_end|> but some configs name only <|endoftext|>: stop at any.
        names = {tokenizer.eos_token, "<|im_end|>", "<|endoftext|>"}
        vocab = tokenizer.get_vocab()
        self.stop_ids = sorted({vocab[t] for t in names if t in vocab} | _as_set(self.model.generation_config.eos_token_id))
        if not self.stop_ids:
            raise ValueError(f"HFBackend: the tokenizer at {model_dir} defines no end-of-turn token; set eos_token")
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.stop_ids[0]
        self.decoder = StaticDecoder(self.model, self.stop_ids, self.pad_id, self.compile) if self.cache == "static" \
            else None

    @torch.inference_mode()
    def generate(self, prompts: list[str], sampling: Sampling, seed: int) -> list[list[Completion]]:
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        order = sequence_order([len(x) for x in ids], sampling.n, self.sort_by_length)
        cache_len = _round_up(max(map(len, ids)) + sampling.max_new_tokens, CACHE_LEN_MULTIPLE)
        flat: list[Completion | None] = [None] * len(order)
        for start in range(0, len(order), self.batch_size):
            torch.manual_seed(seed + start)  # each chunk its own stream: a resumed run redraws the same chunk
            chunk = order[start:start + self.batch_size]
            rows = self._generate_rows([ids[i // sampling.n] for i in chunk], sampling, cache_len)
            for i, row in zip(chunk, rows):
                flat[i] = self._completion(row, sampling.max_new_tokens)
        return [flat[p * sampling.n:(p + 1) * sampling.n] for p in range(len(prompts))]

    def _generate_rows(self, rows: list[list[int]], sampling: Sampling, cache_len: int) -> torch.Tensor:
        """The new tokens of one generate call over left-padded rows, [rows, new tokens] on the CPU."""
        if self.decoder is not None:
            # A call's rows fill the batch (the last chunk repeats its last row) and its cache is sized to the
            # whole generate() call's longest sequence, rounded up: the calls, and later ones no longer, share
            # one shape and so one compiled decode step.
            fill = self.batch_size - len(rows) if self.decoder.compile else 0
            enc = self._pad(rows + rows[-1:] * fill)
            return self.decoder.generate(enc["input_ids"], enc["attention_mask"], sampling.max_new_tokens,
                                         sampling.temperature, sampling.top_p, cache_len)[:len(rows)].cpu()
        enc = self._pad(rows)
        greedy = sampling.temperature == 0
        out = self.model.generate(
            **enc, do_sample=not greedy, temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p, top_k=None, max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.stop_ids, pad_token_id=self.pad_id,
        )
        return out[:, enc["input_ids"].shape[1]:].cpu()

    def _pad(self, rows: list[list[int]]) -> dict:
        return self.tokenizer.pad({"input_ids": rows}, padding_side="left", return_tensors="pt").to(self.device)

    def _completion(self, tokens: torch.Tensor, max_new_tokens: int) -> Completion:
        stops = torch.isin(tokens, torch.tensor(self.stop_ids))
        if stops.any():
            end = int(stops.nonzero()[0])
            return Completion(self.tokenizer.decode(tokens[:end], skip_special_tokens=True), end + 1, "stop")
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return Completion(text, len(tokens), "length" if len(tokens) >= max_new_tokens else "stop")


CACHE_LEN_MULTIPLE = 256  # static cache lengths come in steps of this many tokens: few distinct compiled shapes


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def sequence_order(prompt_lengths: list[int], n: int, by_length: bool) -> list[int]:
    """The order in which the (prompt, sample) sequences are generated, as flat indices prompt * n + sample:
    by prompt length (stable, so samples of one prompt stay together) or as given."""
    prompts = sorted(range(len(prompt_lengths)), key=prompt_lengths.__getitem__) if by_length \
        else range(len(prompt_lengths))
    return [p * n + s for p in prompts for s in range(n)]


CACHES = ("auto", "dynamic", "static")
BACKENDS = ("auto", "vllm", "hf")


def check_cache_options(cache: str, compile: bool | None) -> None:
    """backend.cache and backend.compile, as far as they can be judged before the device is known."""
    if cache not in CACHES:
        raise ValueError(f"backend.cache must be one of {', '.join(CACHES)}; got {cache!r}")
    if compile and cache == "dynamic":
        raise ValueError("backend.compile=true needs backend.cache=static (the decode step is compiled only over "
                         "a static cache); set backend.cache=static, or backend.compile=false")


def _cache_and_compile(cache: str, compile: bool | None, device: str) -> tuple[str, bool]:
    """The KV cache ("dynamic" | "static") and whether the decode step is compiled. auto: static and
    compiled on a GPU; dynamic on a CPU, where transformers does not compile generate and a static
    cache only adds attention over its empty slots."""
    check_cache_options(cache, compile)
    gpu = device.startswith("cuda")
    cache = ("static" if gpu else "dynamic") if cache == "auto" else cache
    compile = cache == "static" and gpu if compile is None else compile
    if compile and not gpu:
        raise ValueError(f"backend.compile=true needs a GPU (device={device}); use backend.compile=false on a CPU")
    if compile and cache != "static":  # cache=auto resolved to dynamic
        raise ValueError(f"backend.compile=true needs backend.cache=static; cache=auto is dynamic on {device}")
    return cache, compile


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
                 batch_size: int = 8, cache: str = "auto", compile: bool | None = None, sort_by_length: bool = True,
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.9, seed: int = 0) -> GenerationBackend:
    if name == "auto":
        name = "vllm" if vllm_available() else "hf"
    if name == "vllm":
        return VLLMBackend(model_dir, tensor_parallel_size=tensor_parallel_size,
                           gpu_memory_utilization=gpu_memory_utilization, seed=seed)
    if name == "hf":
        return HFBackend(model_dir, tokenizer, device=device, dtype=dtype, batch_size=batch_size, cache=cache,
                         compile=compile, sort_by_length=sort_by_length)
    raise ValueError(f"backend.name must be one of {', '.join(BACKENDS)}; got {name!r}")
