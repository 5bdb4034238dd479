"""HF-backend generation throughput (new tokens/s) of infir-eval, for hosts without vLLM, mode by mode.

Builds a random Qwen2 of a size from infir.model.qwen's table (its own vocabulary size; the demo tokenizer
writes the prompts) and times `HFBackend.generate` as `infir-eval run` calls it (InfiR2 sampling:
temperature 0.65, top-p 0.95), in modes:
  baseline    dynamic KV cache, sequences generated in the prompts' order
  sorted      dynamic KV cache, sequences batched by prompt length
  static      batched by length, static KV cache, infir's decoder (infir.eval.decode: each token's step,
              sampling included, one compiled call with CUDA graphs; the GPU default; on a CPU not compiled)
  hf-static   the same batches through transformers' generate with its static cache and compiled forward
              (what HFBackend ran before infir's decoder), called directly on the model
  continuous  transformers' continuous batching (`generate_batch`, its own scheduler and paged cache), called
              directly on the same prompts: the scheduling nearest vLLM's that transformers has
The prompts are random text of --prompt-tokens lengths (uniform) in the chat template. Every sequence
generates exactly --new-tokens tokens (transformers' modes mask the end tokens until then; infir's decoder
is given no end token, as vLLM's ignore_eos), so every mode counts the same tokens. Each mode first runs one untimed call over the longest prompts (one batch):
kernels, compilation, CUDA graphs; its time is the `warm-up s` column.

    python bench/generate.py --device cpu --sizes tiny --batch 8 --prompts 16 --new-tokens 32 --modes baseline sorted
    python bench/generate.py --device cuda --sizes qwen2.5-0.5b --batch 64 --prompts 128 --new-tokens 1024
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import base_parser, emit, kernel_times_us, markdown_table  # noqa: E402

MODES = {"baseline": {"cache": "dynamic", "sort_by_length": False},
         "sorted": {"cache": "dynamic", "sort_by_length": True},
         "static": {"cache": "static", "sort_by_length": True},
         "hf-static": None,
         "continuous": None}
# Published vLLM figures, searched for a same-size model at a batch that compares; none was found.
VLLM_NOTE = ("vLLM: no published throughput of a 0.5B model under batched decoding was found to set beside these "
             "rows; Qwen's speed benchmark (https://qwen.readthedocs.io/en/v2.0/_sources/benchmark/speed_benchmark.rst.txt) "
             "times Qwen2-0.5B-Instruct under vLLM 0.4.2 at batch size 1 on an A100, which does not compare.")


def build_model(size_name: str, tokenizer, out_dir: Path, vocab: int | None) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from infir.model.qwen import get_size

    size = get_size(size_name)
    config = Qwen2Config(vocab_size=vocab or size.vocab, hidden_size=size.hidden, intermediate_size=size.ffn,
                         num_hidden_layers=size.layers, num_attention_heads=size.heads,
                         num_key_value_heads=size.kv_heads, max_position_embeddings=size.max_positions,
                         tie_word_embeddings=size.tied, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def prompts(tokenizer, count: int, lengths: tuple[int, int], seed: int = 0) -> list[str]:
    """Chat-templated user turns of random words, their token counts drawn uniformly from `lengths`."""
    rng = random.Random(seed)
    words = [w for w in tokenizer.get_vocab() if w.isalpha()]
    out = []
    for _ in range(count):
        target, text = rng.randint(*lengths), ""
        while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < target:
            text += " " + " ".join(rng.choices(words, k=16))
        message = [{"role": "user", "content": text}]
        out.append(tokenizer.apply_chat_template(message, tokenize=False, add_generation_prompt=True))
    return out


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str) -> tuple[float, object]:
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def longest_batch(backend, texts: list[str], sampling) -> list[str]:
    """The prompts of one generate call, the longest: the warm-up's, whose shapes a timed call meets again."""
    ids = backend.tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [texts[i] for i in sorted(range(len(texts)), key=lambda i: -len(ids[i]))[:max(1, backend.batch_size // sampling.n)]]


def measure_backend(backend, texts: list[str], sampling) -> tuple[float, float, int]:
    """(warm-up s, timed s, new tokens) of HFBackend.generate over `texts`."""
    warm, _ = timed(lambda: backend.generate(longest_batch(backend, texts, sampling), sampling, seed=0), backend.device)
    seconds, out = timed(lambda: backend.generate(texts, sampling, seed=1), backend.device)
    return warm, seconds, sum(c.num_tokens for completions in out for c in completions)


def kernel_profile(backend, texts: list[str], sampling, mode: str, ms_per_step: float, top: int = 5) -> dict:
    """Where a decode step's time goes: the warm-up's call again under torch.profiler, its GPU kernel time per
    step beside the timed call's wall time per step (their ratio: how busy the host kept the GPU), and the
    kernels that took most of it."""
    times = kernel_times_us(lambda: backend.generate(longest_batch(backend, texts, sampling), sampling, seed=2), reps=1)
    total = sum(us for us, _ in times.values())
    gpu_ms = total / 1e3 / sampling.max_new_tokens
    ranked = sorted(times.items(), key=lambda kv: -kv[1][0])[:top]
    return {"mode": mode, "GPU ms/step": gpu_ms, "wall ms/step": ms_per_step, "GPU busy %": 100 * gpu_ms / ms_per_step,
            "kernels a step": sum(n for _, n in times.values()) / sampling.max_new_tokens,
            "top kernels (% of GPU time)": "; ".join(f"{name[:48]} {100 * us / total:.0f}" for name, (us, _) in ranked)}


def measure_continuous(model, tokenizer, texts: list[str], sampling, device: str, batch: int) -> tuple[float, float, int]:
    """The same for transformers' continuous batching, called on the model directly."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    config = GenerationConfig(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=None,
                              max_new_tokens=sampling.max_new_tokens, min_new_tokens=sampling.max_new_tokens,
                              num_return_sequences=sampling.n, eos_token_id=model.generation_config.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    run = lambda inputs, seed: model.generate_batch(
        inputs, generation_config=config, continuous_batching_config=ContinuousBatchingConfig(seed=seed))
    warm, _ = timed(lambda: run(sorted(ids, key=len)[-max(1, batch // sampling.n):], 0), device)
    seconds, out = timed(lambda: run(ids, 1), device)
    return warm, seconds, sum(len(o.generated_tokens) for o in out.values())


def measure_hf_static(model, tokenizer, texts: list[str], sampling, device: str, batch: int) -> tuple[float, float, int]:
    """The same for transformers' generate with its static cache and compiled forward, over the prompts in
    length order, `batch` sequences a call, the cache sized as HFBackend sizes it."""
    from infir.eval.backends import CACHE_LEN_MULTIPLE

    ids = sorted(tokenizer(texts, add_special_tokens=False)["input_ids"], key=len)
    rows = [x for x in ids for _ in range(sampling.n)]
    cache_len = -(-(len(rows[-1]) + sampling.max_new_tokens) // CACHE_LEN_MULTIPLE) * CACHE_LEN_MULTIPLE

    def run(chunk_rows, seed):
        torch.manual_seed(seed)
        tokens = 0
        for start in range(0, len(chunk_rows), batch):
            enc = tokenizer.pad({"input_ids": chunk_rows[start:start + batch]}, padding_side="left",
                                return_tensors="pt").to(device)
            out = model.generate(**enc, do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                                 top_k=None, max_new_tokens=sampling.max_new_tokens,
                                 min_new_tokens=sampling.max_new_tokens, cache_implementation="static",
                                 max_cache_len=cache_len, pad_token_id=tokenizer.pad_token_id)
            tokens += out.shape[0] * (out.shape[1] - enc["input_ids"].shape[1])
        return tokens

    warm, _ = timed(lambda: run(rows[-batch:], 0), device)
    seconds, tokens = timed(lambda: run(rows, 1), device)
    return warm, seconds, tokens


DIRECT = {"hf-static": measure_hf_static, "continuous": measure_continuous}  # modes called on the model itself


def measure(model_dir: Path, tokenizer, mode: str, texts: list[str], sampling, args) -> dict:
    from infir.eval.backends import HFBackend

    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    options = MODES[mode] or {"cache": "dynamic"}
    backend = HFBackend(model_dir, tokenizer, device=args.device, dtype=args.dtype, batch_size=args.batch, **options)
    # every sequence runs its full length: transformers' generate masks the end tokens until max_new_tokens,
    # and infir's decoder is given an end token that no sequence holds
    backend.model.generation_config.min_new_tokens = sampling.max_new_tokens
    if backend.decoder is not None:
        backend.stop_ids = [-1]
        backend.decoder.stops = torch.tensor(backend.stop_ids, device=backend.model.device)
    if mode in DIRECT:
        warm, seconds, tokens = DIRECT[mode](backend.model, tokenizer, texts, sampling, args.device, args.batch)
    else:
        warm, seconds, tokens = measure_backend(backend, texts, sampling)
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else None
    steps = -(-len(texts) * sampling.n // args.batch) * sampling.max_new_tokens
    ms_per_step = 1e3 * seconds / steps if mode != "continuous" else None
    profile = (kernel_profile(backend, texts, sampling, mode, ms_per_step)
               if args.profile and mode not in DIRECT and args.device.startswith("cuda") else None)
    dtype = str(backend.model.dtype).replace("torch.", "")
    del backend
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    row = {"mode": mode, "dtype": dtype, "batch": args.batch, "sequences": len(texts) * sampling.n,
           "new tokens": tokens, "seconds": seconds, "tokens/s": tokens / seconds,
           "ms/step": ms_per_step, "warm-up s": warm, "peak GiB": peak, "profile": profile}
    return {k: v for k, v in row.items() if v is not None}  # a blank cell: not measured in this mode


def spread(args) -> list[dict]:
    """Every (size, mode) in a process of its own on one of --gpus GPUs, as many at once as there are GPUs:
    a mode's warm-up (compilation, CUDA graphs) and timed calls take minutes at 0.5B; the rows in the order
    asked."""
    import subprocess

    jobs = [(size, mode) for size in args.sizes for mode in args.modes]
    common = ["--device", args.device, "--batch", str(args.batch), "--prompts", str(args.prompts), "--n", str(args.n),
              "--prompt-tokens", *map(str, args.prompt_tokens), "--new-tokens", str(args.new_tokens),
              "--dtype", args.dtype, *(["--vocab", str(args.vocab)] if args.vocab else []),
              *(["--threads", str(args.threads)] if args.threads else []), *(["--profile"] if args.profile else [])]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",")[:args.gpus] if visible else [str(g) for g in range(args.gpus)]
    with tempfile.TemporaryDirectory() as tmp:
        pending, running, free, rows = list(enumerate(jobs)), {}, gpus, {}
        while pending or running:
            while pending and free:
                i, (size, mode) = pending.pop(0)
                gpu, log = free.pop(0), os.path.join(tmp, f"{i}.log")
                with open(log, "w") as out:  # the child holds its own copy of the file
                    proc = subprocess.Popen([sys.executable, __file__, *common, "--sizes", size, "--modes", mode,
                                             "--rows", os.path.join(tmp, f"{i}.json")],
                                            env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu},
                                            stdout=out, stderr=subprocess.STDOUT)
                running[i] = (gpu, (size, mode), proc, log)
            done = wait_any(running)
            gpu, job, proc, log = running.pop(done)
            free.append(gpu)
            if proc.returncode:
                for _, _, other, _ in running.values():
                    other.kill()
                raise SystemExit(f"generate.py: mode {job[1]} ({job[0]}) failed on GPU {gpu}, exit {proc.returncode}; "
                                 f"its output ends:\n{Path(log).read_text()[-3000:]}")
            rows[job] = json.loads(Path(tmp, f"{done}.json").read_text())
        out = [row for job in jobs for row in rows[job]]
    for row in out:
        print(row, flush=True)
    return out


def wait_any(running: dict) -> int:
    """The key of a process of `running` that has ended, waiting for one."""
    while True:
        for key, (_, _, proc, _) in running.items():
            if proc.poll() is not None:
                return key
        time.sleep(0.5)


def parse_args():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", nargs="+", default=["tiny"])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--batch", type=int, default=16, help="sequences per generate call (backend.batch_size)")
    parser.add_argument("--prompts", type=int, default=64, help="prompts timed (a multiple of --batch: full calls)")
    parser.add_argument("--n", type=int, default=1, help="samples per prompt")
    parser.add_argument("--prompt-tokens", nargs=2, type=int, default=[100, 600], metavar=("MIN", "MAX"))
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the model size's own)")
    parser.add_argument("--dtype", default="auto", help="auto = bf16 on GPU, fp32 on CPU")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's); 1 on a shared, loaded CPU")
    parser.add_argument("--gpus", type=int, default=1,
                        help="run the modes at once, each in its own process on one of this many GPUs (on a CPU: "
                             "this many processes)")
    parser.add_argument("--profile", action="store_true",
                        help="GPU: profile each infir-backend mode's warm-up call again (kernel time per decode step "
                             "against the timed wall time per step, and the kernels that take most of it)")
    parser.add_argument("--rows", help=argparse.SUPPRESS)  # a --gpus child: its rows as JSON here, no report
    args = parser.parse_args()
    if args.gpus > 1 and args.device.startswith("cuda") and torch.cuda.device_count() < args.gpus:
        raise SystemExit(f"--gpus {args.gpus} asks for that many GPUs; torch sees {torch.cuda.device_count()}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but torch sees no GPU; use --device cpu")
    return args


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from infir.data import DEMO_TOKENIZER
    from infir.eval.benchmarks import Sampling

    tokenizer = AutoTokenizer.from_pretrained(DEMO_TOKENIZER)
    texts = prompts(tokenizer, args.prompts, tuple(args.prompt_tokens))
    lengths = [len(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    sampling = Sampling(n=args.n, temperature=0.65, top_p=0.95, max_new_tokens=args.new_tokens)
    if args.gpus > 1:
        rows = spread(args)
    else:
        rows = []
        for size_name in args.sizes:
            with tempfile.TemporaryDirectory() as tmp:
                model_dir = build_model(size_name, tokenizer, Path(tmp), args.vocab)
                for mode in args.modes:
                    row = measure(model_dir, tokenizer, mode, texts, sampling, args)
                    rows.append({"model": size_name, **row})
                    print(rows[-1], flush=True)
        if args.rows:
            Path(args.rows).write_text(json.dumps(rows))
            return
    import transformers

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    notes = (f"transformers {transformers.__version__}; infir.eval.backends.HFBackend (hf-static: the model's "
             f"generate with a static cache; continuous: its generate_batch); {len(texts)} prompts x {args.n} samples, "
             f"prompt tokens {min(lengths)}-{max(lengths)} "
             f"(mean {sum(lengths) / len(lengths):.0f}), exactly {args.new_tokens} new tokens per sequence, "
             "temperature 0.65, top-p 0.95, random weights; ms/step: seconds over generate calls x new tokens; "
             f"torch CPU threads {torch.get_num_threads()}, host load average {load} (1/5/15 min)."
             + (f" The modes ran at once, each in its own process, {args.gpus} at a time (on a GPU each)."
                if args.gpus > 1 else ""))
    profiles = [{"model": row["model"], **row.pop("profile")} for row in rows if "profile" in row]
    tables = [markdown_table(rows)]
    if profiles:
        tables += ["Where a decode step's time goes (the warm-up's call again under torch.profiler; GPU busy % = GPU "
                   "kernel time per step over the timed call's wall time per step):", markdown_table(profiles)]
    emit("infir-eval generation throughput (HF backend)", [notes, VLLM_NOTE, *tables], args.out)


if __name__ == "__main__":
    main()
