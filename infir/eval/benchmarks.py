"""Benchmark registry: each file `eval/<name>.py` declares one `BENCHMARK = Benchmark(...)`.

A benchmark says where its problems come from (a public HF dataset id, a bundle written by
`infir-eval bundle` (infir.eval.bundle), or a local jsonl/parquet file or directory in the same schema),
how one record becomes a `Problem` (prompt, gold answer or tests), which grader applies and its
reference sampling. Adding a benchmark is adding a file; the directory
is `eval/` beside the package, or `$INFIR_EVAL_BENCHMARKS` to use your own set.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from infir.eval.bundle import bundle_dir, read_records

GRADERS = ("math", "choice", "code")

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class Sampling:
    n: int = 1
    temperature: float = 0.65
    top_p: float = 0.95
    max_new_tokens: int = 32768

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"Sampling.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"Sampling.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"Sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"Sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass(frozen=True)
class Problem:
    id: str
    prompt: str  # the user turn; the runner applies the model's chat template
    answer: str = ""  # gold answer for "math"/"choice"; empty for "code"
    code_task: object | None = None  # infir.eval.code_tests.CodeTask for "code"


@dataclass(frozen=True)
class Benchmark:
    name: str
    grader: str
    hf_id: str
    # (record in the dataset's schema, rng) -> Problem; one rng per load, seeded with the run's seed and
    # handed to the kept records in dataset order (GPQA shuffles its options with it)
    to_problem: Callable[[dict, random.Random], Problem]
    sample_file: Path | None = None  # the small set we ship, in the dataset's schema (tests, smoke runs)
    hf_config: str | tuple[str, ...] | None = None  # a tuple: configs read one after the other
    split: str = "test"
    hf_data_files: tuple[str, ...] = ()  # raw jsonl files of the repository, read through huggingface_hub (LiveCodeBench)
    keep: Callable[[dict], bool] = lambda record: True  # e.g. LiveCodeBench's contest date window
    sampling: Sampling = field(default_factory=Sampling)
    letters: str = "ABCD"  # for "choice"
    records: Callable[[], Iterable[dict]] | None = None  # generated benchmarks (demo_arith): no files
    system_prompt: str | None = None  # the benchmark's own system turn (LiveCodeBench's), unless the run sets one

    def __post_init__(self):
        if self.grader not in GRADERS:
            raise ValueError(f"benchmark {self.name}: grader must be one of {GRADERS}, got {self.grader!r}")


def benchmarks_dir() -> Path:
    configured = os.environ.get("INFIR_EVAL_BENCHMARKS")
    return Path(configured) if configured else Path(__file__).resolve().parents[2] / "eval"


@functools.lru_cache(maxsize=None)
def _registry(directory: Path) -> dict[str, Benchmark]:
    if not directory.is_dir():
        raise FileNotFoundError(
            f"benchmark declarations not found at {directory}: run from a checkout of infir, or point "
            "$INFIR_EVAL_BENCHMARKS at a directory of <name>.py files that each define BENCHMARK")
    found = {}
    for path in sorted(directory.glob("*.py")):
        if path.name.startswith("_"):
            continue
        spec = importlib.util.spec_from_file_location(f"infir_eval_benchmarks.{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        bench = getattr(module, "BENCHMARK", None)
        if not isinstance(bench, Benchmark):
            raise TypeError(f"{path} must define BENCHMARK = infir.eval.benchmarks.Benchmark(...)")
        if bench.name != path.stem:
            raise ValueError(f"{path}: BENCHMARK.name is {bench.name!r}; name the file after it")
        found[bench.name] = bench
    return found


def registry() -> dict[str, Benchmark]:
    return _registry(benchmarks_dir())


def get_benchmark(name: str) -> Benchmark:
    benchmarks = registry()
    if name not in benchmarks:
        raise KeyError(f"unknown benchmark {name!r}; known: {sorted(benchmarks)} (declared in {benchmarks_dir()})")
    return benchmarks[name]


def _read_local(path: Path) -> Iterator[dict]:
    files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".parquet")) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"no .jsonl or .parquet files in {path}")
    for file in files:
        if file.suffix == ".jsonl":
            with open(file) as f:
                yield from (json.loads(line) for line in f if line.strip())
        elif file.suffix == ".parquet":
            import pyarrow.parquet as pq

            yield from pq.read_table(file).to_pylist()
        else:
            raise ValueError(f"{file}: local benchmark files must be .jsonl or .parquet")


class HubError(RuntimeError):
    """The hub did not give a benchmark's records (no network, a gated dataset, a moved file)."""


def _raw_files(bench: Benchmark) -> Iterator[dict]:
    """The records of a dataset published as jsonl files. LiveCodeBench's repository loads through a
    script, which `datasets` no longer runs (4.0 and later); its files read the same under any version."""
    from huggingface_hub import hf_hub_download

    for name in bench.hf_data_files:
        with open(hf_hub_download(bench.hf_id, name, repo_type="dataset")) as f:
            yield from (json.loads(line) for line in f if line.strip())


def hub_records(bench: Benchmark) -> Iterator[dict]:
    """The benchmark's records from the HF hub, in the hub's order."""
    import datasets

    configs = bench.hf_config if isinstance(bench.hf_config, tuple) else (bench.hf_config,)
    try:
        if bench.hf_data_files:
            yield from _raw_files(bench)
        else:
            for config in configs:
                yield from datasets.load_dataset(bench.hf_id, config, split=bench.split)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise HubError(
            f"{bench.name}: could not load {bench.hf_id} ({bench.hf_config or 'default'}, split {bench.split}): {first}. "
            f"Without network access, write a bundle where there is (`infir-eval bundle DIR`) and run with "
            f"source=bundle:DIR, or pass a local file: sources.{bench.name}=/path/to.jsonl"
        ) from e


def load_problems(bench: Benchmark, source: str = "hub", seed: int = 0, limit: int | None = None) -> list[Problem]:
    """Problems of `bench` from `source`: "hub" (its HF dataset id), "samples" (the shipped set),
    "bundle:DIR" (a bundle, checksums verified) or a local .jsonl/.parquet file or directory in the
    dataset's schema."""
    if bench.records is not None:
        records = bench.records()
    elif source == "hub":
        records = hub_records(bench)
    elif bundle_dir(source) is not None:
        records = read_records(bundle_dir(source), bench.name)
    elif source == "samples":
        if bench.sample_file is None:
            raise ValueError(f"{bench.name} ships no sample set; use sources.{bench.name}=hub or a local path")
        records = _read_local(bench.sample_file)
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"{bench.name}: source {source!r} is neither 'hub', 'samples', 'bundle:DIR' "
                                    "nor an existing path")
        records = _read_local(path)
    problems, rng = [], random.Random(seed)
    for record in records:
        if bench.keep(record):
            problems.append(bench.to_problem(record, rng))
            if limit is not None and len(problems) == limit:
                break
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{bench.name}: problem ids are not unique; the per-sample cache needs them to be")
    return problems
