"""HF-backend generation throughput (new tokens/s) of infir-eval, for hosts without vLLM.

Builds a random Qwen2 of a size from infir.model.qwen's table (vocabulary cut to the demo tokenizer's),
renders the demo's held-out problems with the chat template, and times `HFBackend.generate` exactly
as `infir-eval run` calls it (InfiR2 sampling: temperature 0.65, top-p 0.95). Tokens are counted from
the completions (a random model may stop early on an end token), after one warm-up call per case.

    python bench/generate.py --device cpu --sizes tiny --batch 1 16 --new-tokens 128
    python bench/generate.py --device cuda --sizes tiny qwen2.5-0.5b --batch 1 16 64 --new-tokens 256
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import base_parser, emit, markdown_table  # noqa: E402


def build_model(size_name: str, tokenizer, out_dir: Path) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from infir.model.qwen import get_size

    size = get_size(size_name)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=size.hidden, intermediate_size=size.ffn,
                         num_hidden_layers=size.layers, num_attention_heads=size.heads,
                         num_key_value_heads=size.kv_heads, max_position_embeddings=size.max_positions,
                         tie_word_embeddings=size.tied, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def prompts(tokenizer, count: int) -> list[str]:
    from infir.eval.benchmarks import get_benchmark, load_problems
    from infir.eval.runner import render_prompt

    problems = load_problems(get_benchmark("demo_arith"))
    return [render_prompt(tokenizer, problems[i % len(problems)], None) for i in range(count)]


def measure(backend, batch: int, new_tokens: int, tokenizer) -> dict:
    from infir.eval.benchmarks import Sampling

    sampling = Sampling(n=1, temperature=0.65, top_p=0.95, max_new_tokens=new_tokens)
    backend.batch_size = batch
    texts = prompts(tokenizer, batch)
    backend.generate(texts, sampling, seed=0)  # warm-up: kernels, allocator, caches
    if backend.device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = backend.generate(texts, sampling, seed=1)
    if backend.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = sum(c.num_tokens for completions in out for c in completions)
    return {"batch": batch, "new tokens": tokens, "seconds": seconds, "tokens/s": tokens / seconds,
            "ms/step": 1e3 * seconds / max(c.num_tokens for completions in out for c in completions)}


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", nargs="+", default=["tiny"])
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="auto", help="auto = bf16 on GPU, fp32 on CPU")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's); 1 on a shared, loaded CPU")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but torch sees no GPU; use --device cpu")

    from transformers import AutoTokenizer

    from infir.data import DEMO_TOKENIZER
    from infir.eval.backends import HFBackend

    tokenizer = AutoTokenizer.from_pretrained(DEMO_TOKENIZER)
    rows = []
    for size_name in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = build_model(size_name, tokenizer, Path(tmp))
            backend = HFBackend(model_dir, tokenizer, device=args.device, dtype=args.dtype)
            params = sum(p.numel() for p in backend.model.parameters())
            for batch in args.batch:
                row = measure(backend, batch, args.new_tokens, tokenizer)
                rows.append({"model": f"{size_name} ({params / 1e6:.1f}M)", "device": args.device,
                             "dtype": str(backend.model.dtype).replace("torch.", ""), **row})
            del backend
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    load = ", ".join(f"{x:.1f}" for x in __import__("os").getloadavg())
    notes = (f"HF transformers generate through infir.eval.backends.HFBackend, up to {args.new_tokens} new tokens "
             "per sequence, temperature 0.65, top-p 0.95, random weights, vocabulary 8192 (demo tokenizer); "
             f"torch CPU threads {torch.get_num_threads()}, host load average {load} (1/5/15 min).")
    emit("infir-eval generation throughput (HF backend)", [notes, markdown_table(rows)], args.out)


if __name__ == "__main__":
    main()
