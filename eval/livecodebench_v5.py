"""LiveCodeBench v5, problems dated 2024-08-01 to 2025-02-01 (the window InfiR2 reports), with
EvalScope's prompt and system prompt.

HF dataset `livecodebench/code_generation_lite`, read as its raw files test.jsonl .. test5.jsonl through
huggingface_hub (release_v5 is the union of the v1..v5 files; the repository's loading script does not
run under datasets 4 and later). Fields: question_id,
question_content, starter_code, contest_date, public_test_cases (JSON), private_test_cases (JSON or
base64(zlib(pickle(JSON)))), metadata (JSON with func_name for LeetCode-style problems).
Reference sampling (eval/README.md): 8 samples, up to 27,000 new tokens."""
import json
from datetime import datetime
from pathlib import Path

from infir.eval.benchmarks import Benchmark, Problem, Sampling
from infir.eval.code_tests import CodeTask, decode_lcb_tests
from infir.eval.prompts import CODE_SYSTEM_PROMPT, code_prompt

DATE_FROM, DATE_TO = datetime(2024, 8, 1), datetime(2025, 2, 1)


def in_window(record: dict) -> bool:
    """EvalScope's date filter: both ends inclusive, compared as datetimes (midnight of DATE_TO is in)."""
    return DATE_FROM <= datetime.fromisoformat(str(record["contest_date"])) <= DATE_TO


def to_problem(record: dict, rng) -> Problem:
    tests = decode_lcb_tests(record["public_test_cases"]) + decode_lcb_tests(record["private_test_cases"])
    metadata = json.loads(record.get("metadata") or "{}")
    starter = record.get("starter_code") or ""
    style = "functional" if metadata.get("func_name") else "stdin"  # the harness goes by func_name alone
    task = CodeTask(tests=tuple(tests), style=style, func_name=metadata.get("func_name"))
    return Problem(id=record["question_id"], prompt=code_prompt(record["question_content"], starter), code_task=task)


BENCHMARK = Benchmark(
    name="livecodebench_v5",
    grader="code",
    hf_id="livecodebench/code_generation_lite",
    hf_data_files=("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl"),
    split="train",
    keep=in_window,
    to_problem=to_problem,
    sample_file=Path(__file__).parent / "samples" / "livecodebench_v5.jsonl",
    sampling=Sampling(n=8, temperature=0.65, top_p=0.95, max_new_tokens=27_000),
    system_prompt=CODE_SYSTEM_PROMPT,
)
