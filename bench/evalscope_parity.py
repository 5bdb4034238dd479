"""infir's graders against EvalScope's own, on the same responses (bench/evalscope_cases.py).

InfiR2 scored its models with EvalScope 0.17 (its eval scripts pass `{query}` prompt templates and a
`remove_until: </think>` filter, which only the 0.x releases read), so that is the version pinned here.
Two steps, because EvalScope 0.17 pins `datasets==3.2.0` and cannot live in infir's environment:

1. `record`, in a virtual environment that has EvalScope (it sees this environment's sympy,
   latex2sympy2_extended and antlr4, so both graders run on the same libraries):
       python -m venv --system-site-packages /tmp/es && /tmp/es/bin/pip install --no-deps evalscope==0.17.1 \\
           word2number modelscope jsonlines sacrebleu
       /tmp/es/bin/python bench/evalscope_parity.py record
   writes EvalScope's extractions and verdicts for every response (`record math` etc. for one set), its
   prompts for the bundled sample problems and its metrics on random verdicts to tests/fixtures/evalscope/
   (tests/eval/test_evalscope_parity.py holds infir to them).
2. `report`, in infir's environment: `python bench/evalscope_parity.py report` grades the same responses
   with infir and writes the agreement per grader and split, and every disagreement, to
   bench/results/<date>-<commit>/evalscope_parity.{md,json}.
"""
from __future__ import annotations

import argparse
import datetime
import json
import random
import signal
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "evalscope"
sys.path[:0] = [str(REPO), str(REPO / "bench")]  # this checkout's infir, whatever is installed
from result_file import write_result  # noqa: E402
from evalscope_cases import (HELDOUT_SEED, TUNE_SEED, choice_cases, code_cases, code_problems,  # noqa: E402
                             fuzz_cases, math_cases)

SIZES = {"math": 1000, "choice": 600, "code": 600, "fuzz": 3000}  # responses per split
SPLITS = {"tune": TUNE_SEED, "heldout": HELDOUT_SEED}
FILTERS = {"filters": {"remove_until": "</think>"}}  # as InfiR2's eval scripts configure every benchmark
LCB_TIMEOUT_S = 6  # EvalScope's default per-test limit for LiveCodeBench
ENV_PACKAGES = ("evalscope", "sympy", "latex2sympy2_extended", "antlr4-python3-runtime", "word2number", "regex")


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------- record (EvalScope's environment)
def _adapter(name: str):
    from evalscope.benchmarks import Benchmark

    return Benchmark.get(name).get_data_adapter(dict(FILTERS))


class _Deadline:
    """EvalScope's math_equal has no time limit of its own; a case that would hang is recorded as such."""

    def __init__(self, seconds: int):
        self.seconds = seconds

    def __enter__(self):
        signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError()))
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)


def record_math(cases: list[dict]) -> list[dict]:
    import evalscope.benchmarks.math_500.math_500_adapter  # noqa: F401  (registers the benchmark)

    adapter = _adapter("math_500")
    rows = []
    for case in cases:
        pred = adapter.parse_pred_result(case["response"], {}, eval_type="service")
        gold = adapter.get_gold_answer({"answer": case["gold"]})
        try:
            with _Deadline(30):
                correct = bool(adapter.match(gold, pred))
        except TimeoutError:
            correct = None
        rows.append({**case, "es_extracted": pred, "es_gold": gold, "es_correct": correct})
    return rows


def record_choice(cases: list[dict]) -> list[dict]:
    import evalscope.benchmarks.gpqa.gpqa_adapter  # noqa: F401

    adapter = _adapter("gpqa")
    rows = []
    for case in cases:
        pred = adapter.parse_pred_result(case["response"], {}, eval_type="service")
        rows.append({**case, "es_extracted": pred, "es_correct": bool(adapter.match(case["gold"], pred))})
    return rows


def record_code(cases: list[dict]) -> list[dict]:
    import evalscope.benchmarks.live_code_bench.live_code_bench_adapter  # noqa: F401
    from evalscope.benchmarks.live_code_bench.extract_utils import extract_code_generation

    adapter = _adapter("live_code_bench")
    adapter.timeout = LCB_TIMEOUT_S
    problems = code_problems()
    rows = []
    for case in cases:
        filtered = adapter.parse_pred_result(case["response"], {}, eval_type="service")
        gold = {"evaluation_sample": json.dumps(problems[case["problem"]])}
        rows.append({**case, "es_extracted": extract_code_generation(filtered),
                     "es_correct": bool(adapter.match(gold, filtered) == 1.0)})
    return rows


def record_fuzz(cases: list[dict]) -> list[dict]:
    """The string rules alone on fuzz text: the math answer as extracted and normalized, the text
    normalized as a gold answer, the GPQA letter and the program."""
    import evalscope.benchmarks.gpqa.gpqa_adapter  # noqa: F401
    import evalscope.benchmarks.math_500.math_500_adapter  # noqa: F401
    from evalscope.benchmarks.live_code_bench.extract_utils import extract_code_generation
    from evalscope.metrics.math_parser import strip_answer_string

    math, choice = _adapter("math_500"), _adapter("gpqa")
    return [{**case, "es_math": math.parse_pred_result(case["text"], {}, eval_type="service"),
             "es_gold": strip_answer_string(case["text"]),
             "es_choice": choice.parse_pred_result(case["text"], {}, eval_type="service"),
             "es_code": extract_code_generation(case["text"].rsplit("</think>", 1)[-1])} for case in cases]


def record_prompts() -> list[dict]:
    """EvalScope's prompt (and system prompt) for each bundled sample problem, in file order; GPQA's
    options shuffled by the global RNG seeded as EvalScope seeds it (TaskConfig.seed = 42)."""
    import evalscope.benchmarks.aime.aime24_adapter  # noqa: F401
    import evalscope.benchmarks.aime.aime25_adapter  # noqa: F401
    import evalscope.benchmarks.gpqa.gpqa_adapter  # noqa: F401
    import evalscope.benchmarks.live_code_bench.live_code_bench_adapter  # noqa: F401
    import evalscope.benchmarks.math_500.math_500_adapter  # noqa: F401
    from evalscope.benchmarks.live_code_bench.load_utils import transform

    rows = []
    for infir_name, es_name in [("aime24", "aime24"), ("aime25", "aime25"), ("math500", "math_500"),
                                ("gpqa_diamond", "gpqa"), ("livecodebench_v5", "live_code_bench")]:
        adapter = _adapter(es_name)
        random.seed(42)
        for index, record in enumerate(read_jsonl(REPO / "eval" / "samples" / f"{infir_name}.jsonl")):
            record = transform(dict(record)) if es_name == "live_code_bench" else dict(record)
            kwargs = {"subset_name": "gpqa_diamond"} if es_name == "gpqa" else {}
            prompt = adapter.gen_prompt(record, few_shot_list=[], **kwargs)
            rows.append({"benchmark": infir_name, "index": index, "prompt": prompt["data"][0],
                         "system_prompt": prompt.get("system_prompt"),
                         "answer": adapter.get_gold_answer(record) if es_name == "gpqa" else None})
    return rows


def record_metrics() -> list[dict]:
    """EvalScope's headline (AveragePass@1: the mean of every sample's verdict) and Pass@k on random
    verdicts, some with unequal sample counts per problem."""
    from evalscope.metrics.metrics import mean, pass_at_k

    rng = random.Random(7)
    rows = []
    for _ in range(40):
        n = rng.choice([1, 4, 8, 16, 32])
        counts = [n if rng.random() < 0.8 else rng.randint(1, n) for _ in range(rng.randint(1, 12))]
        verdicts = [[int(rng.random() < rng.random()) for _ in range(c)] for c in counts]
        ks = [k for k in (1, 2, 4, 8, 16) if k <= min(counts)]
        rows.append({"verdicts": verdicts, "avg": mean(verdicts),
                     "pass": {str(k): pass_at_k(verdicts, k=k) for k in ks}})
    return rows


def environment() -> dict:
    env = {"python": sys.version.split()[0]}
    for name in ENV_PACKAGES:
        try:
            env[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            env[name] = None
    return env


RECORDERS = {"math": (math_cases, record_math), "choice": (choice_cases, record_choice),
             "code": (code_cases, record_code), "fuzz": (fuzz_cases, record_fuzz)}


def record(kinds: list[str]) -> None:
    env = environment()
    if env["evalscope"] != "0.17.1":
        sys.exit(f"record needs evalscope 0.17.1 (found {env['evalscope']}); see this script's docstring for the venv")
    for kind in kinds:
        make, grade = RECORDERS[kind]
        rows = []
        for split, seed in SPLITS.items():
            rows += [{"split": split, **row} for row in grade(make(seed, SIZES[kind]))]
            print(f"{kind} {split}: {len(rows)} recorded", flush=True)
        write_jsonl(FIXTURES / f"{kind}.jsonl", rows)
    (FIXTURES / "code_problems.json").write_text(json.dumps(code_problems(), indent=1) + "\n")
    write_jsonl(FIXTURES / "prompts.jsonl", record_prompts())
    write_jsonl(FIXTURES / "metrics.jsonl", record_metrics())
    (FIXTURES / "environment.json").write_text(json.dumps(env, indent=1) + "\n")


# ---------------------------------------------------------------- report (infir's environment)


def _grade_math(row: dict) -> dict:
    from infir.eval.graders import grade_math
    from infir.eval.math_answers import normalize_answer

    verdict = grade_math(row["response"], row["gold"])
    return {"extracted": verdict.extracted or "", "gold": normalize_answer(row["gold"]), "correct": verdict.correct}


def _grade_choice(row: dict) -> dict:
    from infir.eval.graders import grade_choice

    verdict = grade_choice(row["response"], row["gold"])
    return {"extracted": verdict.extracted or "", "correct": verdict.correct}


def _grade_code(row: dict, problems: dict) -> dict:
    from infir.eval.code_tests import CodeTask, TestCase, grade_code
    from infir.eval.sandbox import Limits

    spec = problems[row["problem"]]
    task = CodeTask(tests=tuple(TestCase(i, o) for i, o in zip(spec["inputs"], spec["outputs"])),
                    style="functional" if spec["fn_name"] else "stdin", func_name=spec["fn_name"],
                    limits=Limits(wall_s=float(LCB_TIMEOUT_S)))
    verdict, reason = grade_code(row["response"], task)
    return {"extracted": verdict.extracted or "", "correct": verdict.correct, "reason": reason}


FIELDS = {"math": ["extracted", "gold", "correct"], "choice": ["extracted", "correct"], "code": ["extracted", "correct"],
          "fuzz": ["math", "gold", "choice", "code"]}


def _differences(kind: str, row: dict, mine: dict) -> list[str]:
    return [f for f in FIELDS[kind] if mine[f] != row[f"es_{f}"]]


def _fuzz(row: dict) -> dict:
    from infir.eval.extract import extract_choice, extract_code, final_text, stated_answer
    from infir.eval.math_answers import normalize_answer

    text = final_text(row["text"])
    return {"math": normalize_answer(normalize_answer(stated_answer(text))), "gold": normalize_answer(row["text"]),
            "choice": extract_choice(text), "code": extract_code(text) or ""}


def grade_all(kind: str, rows: list[dict]) -> list[dict]:
    from concurrent.futures import ThreadPoolExecutor

    if kind == "code":
        problems = json.loads((FIXTURES / "code_problems.json").read_text())
        with ThreadPoolExecutor(4) as pool:  # sandboxed runs are independent processes
            return list(pool.map(lambda r: _grade_code(r, problems), rows))
    return [{"math": _grade_math, "choice": _grade_choice, "fuzz": _fuzz}[kind](r) for r in rows]


def summarize(kind: str, rows: list[dict], graded: list[dict]) -> dict:
    """Per split: how often each field agrees, and every row where one does not."""
    out = {}
    for split in SPLITS:
        pairs = [(r, m) for r, m in zip(rows, graded) if r["split"] == split and r.get("es_correct", True) is not None]
        agree = {f: sum(r[f"es_{f}"] == m[f] for r, m in pairs) / len(pairs) for f in FIELDS[kind]}
        out[split] = {"responses": len(pairs), "agreement": agree,
                      "evalscope_correct": sum(r.get("es_correct", False) for r, _ in pairs),
                      "disagreements": [{"id": r["id"], "fields": diff, "response": (r.get("response") or r["text"])[-300:],
                                         "evalscope": {f: r[f"es_{f}"] for f in diff}, "infir": {f: m[f] for f in diff}}
                                        for r, m in pairs if (diff := _differences(kind, r, m))]}
    return out


def _git_commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()


def render(results: dict, env: dict) -> str:
    lines = ["## EvalScope parity: infir's graders against EvalScope's on the same responses", "",
             f"- EvalScope {env['evalscope']} recorded with " + ", ".join(f"{k} {v}" for k, v in env.items() if k != "evalscope"),
             "- command: `python bench/evalscope_parity.py report`",
             f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
             "- responses: bench/evalscope_cases.py, seed 1 = tuning set, seed 2 = held-out set (made before any tuning)",
             "", "| grader | split | responses | verdict agreement | extraction agreement | EvalScope correct |",
             "|---|---|---|---|---|---|"]
    for kind in ("math", "choice", "code"):
        for split, s in results[kind].items():
            lines.append(f"| {kind} | {split} | {s['responses']} | {100 * s['agreement']['correct']:.2f}% | "
                         f"{100 * s['agreement']['extracted']:.2f}% | {s['evalscope_correct']} |")
    lines += ["", "Code: the extraction is the program each picks; the verdict is each one's run of it (EvalScope's "
              "harness in a process, infir's in its sandbox). Math: the extraction is the normalized answer.", "",
              "The string rules alone on fuzz text (random strings of the pieces they react to):", "",
              "| split | texts | math answer | gold normalization | GPQA letter | program |", "|---|---|---|---|---|---|"]
    for split, s in results["fuzz"].items():
        lines.append(f"| {split} | {s['responses']} | " + " | ".join(f"{100 * s['agreement'][f]:.2f}%" for f in FIELDS["fuzz"]) + " |")
    lines += ["", "### Every disagreement", ""]
    for kind, splits in results.items():
        for split, s in splits.items():
            lines += [f"- {kind}/{split} `{d['id']}` ({', '.join(d['fields'])}): EvalScope "
                      f"{json.dumps(d['evalscope'], ensure_ascii=False)}, infir {json.dumps(d['infir'], ensure_ascii=False)}; "
                      f"text tail `{json.dumps(d['response'][-160:], ensure_ascii=False)}`" for d in s["disagreements"]]
    if not any(s["disagreements"] for splits in results.values() for s in splits.values()):
        lines.append("(none)")
    return "\n".join(lines) + "\n"


def report() -> None:
    env = json.loads((FIXTURES / "environment.json").read_text())
    results = {}
    for kind in RECORDERS:
        rows = read_jsonl(FIXTURES / f"{kind}.jsonl")
        results[kind] = summarize(kind, rows, grade_all(kind, rows))
        print(kind, {split: len(s["disagreements"]) for split, s in results[kind].items()}, "disagreements", flush=True)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = REPO / "bench" / "results" / f"{date}-{_git_commit()}"
    out.mkdir(parents=True, exist_ok=True)
    text = render(results, env)
    (out / "evalscope_parity.md").write_text(text)
    write_result(out / "evalscope_parity.md", text)  # its tables as the JSON bench/report.py reads
    print(f"wrote {out / 'evalscope_parity.md'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=["record", "report"])
    parser.add_argument("kinds", nargs="*", help=f"record: which response sets to record again, of {list(RECORDERS)} (default: all)")
    args = parser.parse_args()
    if unknown := set(args.kinds) - set(RECORDERS):  # argparse's `choices` refuses an empty "*" list
        parser.error(f"unknown response sets {sorted(unknown)}; choose from {list(RECORDERS)}")
    record(args.kinds or list(RECORDERS)) if args.step == "record" else report()


if __name__ == "__main__":
    main()
