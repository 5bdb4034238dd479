"""One evaluation run: model -> for each benchmark: problems -> generate (skipping what the cache
holds) -> grade -> per-sample jsonl; then metrics, summary.json, report.md and optionally W&B."""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from infir.eval.backends import Completion, GenerationBackend, make_backend
from infir.eval.benchmarks import Benchmark, Problem, Sampling, get_benchmark, load_problems
from infir.eval.cache import SampleCache
from infir.eval.code_tests import grade_code
from infir.eval.graders import grade_answer
from infir.eval.metrics import benchmark_metrics
from infir.eval.model_input import has_tokenizer, resolve_model
from infir.eval.report import log_wandb, summary_markdown
from infir.eval.sandbox import Limits

log = logging.getLogger("infir.eval")


def run_sampling(bench: Benchmark, overrides) -> Sampling:
    """The benchmark's reference sampling with the run's non-null overrides on top."""
    changes = {k: getattr(overrides, k) for k in ("n", "temperature", "top_p", "max_new_tokens")
               if getattr(overrides, k) is not None}
    return dataclasses.replace(bench.sampling, **changes)


def render_prompt(tokenizer, problem: Problem, system_prompt: str | None) -> str:
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
               [{"role": "user", "content": problem.prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _grade(bench: Benchmark, problem: Problem, completion: Completion, limits: Limits) -> dict:
    if bench.grader == "code":
        verdict, reason = grade_code(completion.text, dataclasses.replace(problem.code_task, limits=limits))
    else:
        verdict, reason = grade_answer(bench, completion.text, problem.answer), ""
    return {"extracted": verdict.extracted, "correct": verdict.correct, "reason": reason}


def grade_problem(bench: Benchmark, problem: Problem, prompt: str, completions: list[Completion],
                  limits: Limits, pool: ThreadPoolExecutor | None) -> list[dict]:
    if bench.grader == "code" and pool is not None:  # sandboxed runs are independent processes
        grades = list(pool.map(lambda c: _grade(bench, problem, c, limits), completions))
    else:  # the math grader's sympy time limit needs the main thread
        grades = [_grade(bench, problem, c, limits) for c in completions]
    return [{"benchmark": bench.name, "problem_id": problem.id, "sample": i, "prompt": prompt,
             "response": c.text, "answer": problem.answer, "num_tokens": c.num_tokens,
             "finish_reason": c.finish_reason, **g} for i, (c, g) in enumerate(zip(completions, grades))]


def evaluate_benchmark(bench: Benchmark, problems: list[Problem], backend: GenerationBackend, tokenizer,
                       sampling: Sampling, cache: SampleCache, cfg) -> list[list[dict]]:
    limits = Limits(wall_s=cfg.grading.timeout_s, cpu_s=math.ceil(cfg.grading.timeout_s),
                    memory_bytes=cfg.grading.memory_mb << 20, max_processes=cfg.grading.max_processes,
                    max_disk_bytes=cfg.grading.disk_mb << 20)
    todo = [p for p in problems if not cache.done(p.id)]
    log.info("%s: %d problems, %d cached, %d to generate (n=%d)", bench.name, len(problems),
             len(problems) - len(todo), len(todo), sampling.n)
    pool = ThreadPoolExecutor(cfg.grading.workers) if bench.grader == "code" and cfg.grading.workers > 1 else None
    try:
        for start in range(0, len(todo), cfg.backend.chunk_size):
            chunk = todo[start:start + cfg.backend.chunk_size]
            prompts = [render_prompt(tokenizer, p, cfg.system_prompt or bench.system_prompt) for p in chunk]
            t0 = time.perf_counter()
            completions = backend.generate(prompts, sampling, seed=cfg.seed + problems.index(chunk[0]))
            if len(completions) != len(chunk) or any(len(c) != sampling.n for c in completions):
                raise RuntimeError(f"{bench.name}: the backend returned the wrong number of completions")
            log.info("%s: generated %d problems x %d samples in %.1fs", bench.name, len(chunk), sampling.n,
                     time.perf_counter() - t0)
            for problem, prompt, outs in zip(chunk, prompts, completions):
                cache.add(problem.id, grade_problem(bench, problem, prompt, outs, limits, pool))
    finally:
        if pool is not None:
            pool.shutdown()
    return [cache.rows(p.id) for p in problems]


def evaluate(cfg, backend: GenerationBackend | None = None) -> dict:
    """Run the evaluation `cfg` (an EvalConfig) describes; `backend` replaces the configured one (tests)."""
    from transformers import AutoTokenizer

    model_path = Path(cfg.model).expanduser()
    out_dir = Path(cfg.out_dir or Path("eval_runs") / model_path.name)
    model_dir = resolve_model(model_path, out_dir)  # before out_dir is made: a bad model= leaves nothing behind
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = Path(cfg.tokenizer) if cfg.tokenizer else model_dir
    if not has_tokenizer(tokenizer_dir):
        raise FileNotFoundError(f"no tokenizer in {tokenizer_dir}; pass tokenizer=<HF tokenizer directory>")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if backend is None:
        backend = make_backend(cfg.backend.name, model_dir, tokenizer, device=cfg.backend.device,
                               dtype=cfg.backend.dtype, batch_size=cfg.backend.batch_size,
                               cache=cfg.backend.cache, compile=cfg.backend.compile,
                               sort_by_length=cfg.backend.sort_by_length,
                               tensor_parallel_size=cfg.backend.tensor_parallel_size,
                               gpu_memory_utilization=cfg.backend.gpu_memory_utilization, seed=cfg.seed)

    results, all_rows = {}, {}
    for name in cfg.benchmarks:
        bench = get_benchmark(name)
        sampling = run_sampling(bench, cfg.sampling)
        source = cfg.sources.get(name, cfg.source)
        problems = load_problems(bench, source, seed=cfg.seed, limit=cfg.limit)
        if not problems:
            raise ValueError(f"{name}: no problems loaded from {source!r}")
        fingerprint = {"model": str(model_path.resolve()), "seed": cfg.seed, "source": str(source),
                       "system_prompt": cfg.system_prompt or bench.system_prompt,
                       **{f"sampling.{k}": v for k, v in dataclasses.asdict(sampling).items()}}
        cache = SampleCache(out_dir / "samples" / f"{name}.jsonl", fingerprint, n=sampling.n)
        rows = evaluate_benchmark(bench, problems, backend, tokenizer, sampling, cache, cfg)
        metrics = benchmark_metrics([[r["correct"] for r in problem_rows] for problem_rows in rows], cfg.pass_k)
        results[name] = {"problems": len(problems), "samples": sampling.n, **metrics,
                         "mean_tokens": sum(r["num_tokens"] for pr in rows for r in pr) / sum(len(pr) for pr in rows),
                         "truncated": sum(r["finish_reason"] == "length" for pr in rows for r in pr)}
        all_rows[name] = [r for pr in rows for r in pr]
        log.info("%s: %s", name, {k: round(v, 2) if isinstance(v, float) else v for k, v in results[name].items()})

    headline = [next(v for k, v in r.items() if k.startswith("avg@")) for r in results.values()]
    summary = {"label": cfg.label or out_dir.name, "model": str(cfg.model), "benchmarks": results,
               "overall": {"avg": sum(headline) / len(headline)}, "seed": cfg.seed}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    (out_dir / "report.md").write_text(summary_markdown(summary))
    if cfg.wandb.enabled:
        log_wandb(summary, all_rows, project=cfg.wandb.project, mode=cfg.wandb.mode, name=cfg.wandb.name)
    return summary
