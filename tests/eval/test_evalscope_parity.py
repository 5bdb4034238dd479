"""infir grades, prompts and scores as EvalScope 0.17 does (InfiR2's harness), held to EvalScope's own
outputs recorded by `bench/evalscope_parity.py record` in tests/fixtures/evalscope/: its verdicts on
model-like responses (the held-out split, which no rule here was tuned on), its prompts for the bundled
sample problems, its metrics on random verdicts, and its string rules on fuzz text. The full agreement
figures and every disagreement are in the report `bench/evalscope_parity.py report` writes under
bench/results/.

Kept to seconds: every held-out response's extraction is compared, and every verdict that string and
number rules decide; of the verdicts that need sympy (a tenth of a second each) and of the programs
(a sandboxed run each), a fixed sample.
"""
import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from infir.eval.benchmarks import get_benchmark, _read_local
from infir.eval.code_tests import CodeTask, TestCase, run_tests
from infir.eval.extract import extract_choice, extract_code, final_text, stated_answer
from infir.eval.graders import grade_choice, grade_math
from infir.eval.math_answers import _as_number, normalize_answer
from infir.eval.metrics import benchmark_metrics
from infir.eval.sandbox import Limits

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "evalscope"
TARGET = 0.99
MIN_RESPONSES = 500
SYMPY_SAMPLE, CODE_SAMPLE = 30, 10


def heldout(kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (FIXTURES / f"{kind}.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["split"] == "heldout" and r.get("es_correct", True) is not None]
    assert len(rows) >= MIN_RESPONSES
    return rows


def assert_agree(pairs: list[tuple[object, object, str]], what: str, target: float = TARGET):
    """`pairs`: (infir's, EvalScope's, case id); at least `target` of them equal."""
    differ = [(case, mine, theirs) for mine, theirs, case in pairs if mine != theirs]
    assert 1 - len(differ) / len(pairs) >= target, f"{what}: {len(differ)} of {len(pairs)} differ, e.g. {differ[:5]}"


def test_math_extraction_matches_evalscope():
    rows = heldout("math")
    pairs = [(normalize_answer(normalize_answer(stated_answer(final_text(r["response"])))), r["es_extracted"], r["id"])
             for r in rows]
    assert_agree(pairs, "math extraction")
    assert_agree([(normalize_answer(r["gold"]), r["es_gold"], r["id"]) for r in rows], "math gold normalization")


def _needs_sympy(row: dict) -> bool:
    pred, gold = row["es_extracted"], row["es_gold"]
    return pred.strip().lower() != gold.strip().lower() and (_as_number(pred) is None or _as_number(gold) is None)


def test_math_verdicts_match_evalscope():
    rows = heldout("math")
    by_rules = [r for r in rows if not _needs_sympy(r)]
    by_sympy = random.Random(0).sample([r for r in rows if _needs_sympy(r)], SYMPY_SAMPLE)
    assert {r["es_correct"] for r in by_rules} == {True, False} and {r["es_correct"] for r in by_sympy} == {True, False}
    assert_agree([(grade_math(r["response"], r["gold"]).correct, r["es_correct"], r["id"]) for r in by_rules],
                 "math verdicts decided by string and number rules")
    assert_agree([(grade_math(r["response"], r["gold"]).correct, r["es_correct"], r["id"]) for r in by_sympy],
                 "math verdicts decided by sympy", target=1.0)


def test_choice_matches_evalscope():
    rows = heldout("choice")
    assert_agree([(extract_choice(final_text(r["response"])), r["es_extracted"], r["id"]) for r in rows], "choice extraction")
    assert_agree([(grade_choice(r["response"], r["gold"]).correct, r["es_correct"], r["id"]) for r in rows], "choice verdicts")


def test_code_extraction_matches_evalscope():
    rows = heldout("code")
    assert_agree([(extract_code(final_text(r["response"])) or "", r["es_extracted"], r["id"]) for r in rows],
                 "the program each picks")


def test_code_runs_match_evalscope():
    """One run per kind of program (stdin tricks, prelude names, wrong answers, crashes), slow ones left
    out (each costs the time limit): infir's sandboxed harness passes what EvalScope's passed."""
    problems = json.loads((FIXTURES / "code_problems.json").read_text())
    rows = [r for r in heldout("code") if r["es_extracted"] and r["note"] != "slow"]
    picked = {}
    for r in rows:
        picked.setdefault((r["problem"], r["note"]), r)
    sample = random.Random(0).sample(sorted(picked.values(), key=lambda r: r["id"]), CODE_SAMPLE)
    assert {r["es_correct"] for r in sample} == {True, False}

    def run(r):
        spec = problems[r["problem"]]
        task = CodeTask(tests=tuple(TestCase(i, o) for i, o in zip(spec["inputs"], spec["outputs"])),
                        style="functional" if spec["fn_name"] else "stdin", func_name=spec["fn_name"],
                        limits=Limits(wall_s=6.0))
        return run_tests(r["es_extracted"], task)[0], r["es_correct"], f"{r['id']} ({r['note']})"

    with ThreadPoolExecutor(2) as pool:  # each run is a sandboxed process
        assert_agree(list(pool.map(run, sample)), "program verdicts", target=1.0)


def test_string_rules_match_evalscope_on_fuzz():
    """Random strings of the pieces the rules react to (boxes, fences, \\text, units, number words, ...):
    every extraction and normalization as EvalScope's, in orders no model writes."""
    for r in heldout("fuzz"):
        text = final_text(r["text"])
        assert normalize_answer(normalize_answer(stated_answer(text))) == r["es_math"], r["text"]
        assert normalize_answer(r["text"]) == r["es_gold"], r["text"]
        assert extract_choice(text) == r["es_choice"], r["text"]
        assert (extract_code(text) or "") == r["es_code"], r["text"]


def recorded_prompts(benchmark: str) -> list[dict]:
    rows = [json.loads(line) for line in (FIXTURES / "prompts.jsonl").read_text().splitlines()]
    return [r for r in rows if r["benchmark"] == benchmark]


@pytest.mark.parametrize("name", ["aime24", "aime25", "math500", "gpqa_diamond", "livecodebench_v5"])
def test_prompts_are_evalscopes(name):
    """Every bundled sample problem (the window filter aside) gets EvalScope's prompt and system prompt;
    GPQA's options come in EvalScope's order for its default seed, 42, and the gold letter follows."""
    bench = get_benchmark(name)
    rng = random.Random(42)
    problems = [bench.to_problem(record, rng) for record in _read_local(bench.sample_file)]
    recorded = recorded_prompts(name)
    assert len(problems) == len(recorded) > 0
    for problem, theirs in zip(problems, recorded):
        assert problem.prompt == theirs["prompt"]
        assert bench.system_prompt == theirs["system_prompt"]
        if theirs["answer"] is not None:
            assert problem.answer == theirs["answer"]


def test_metrics_are_evalscopes():
    rows = [json.loads(line) for line in (FIXTURES / "metrics.jsonl").read_text().splitlines()]
    assert any(len({len(v) for v in r["verdicts"]}) > 1 for r in rows)  # unequal sample counts are covered
    for r in rows:
        verdicts = [[bool(v) for v in problem] for problem in r["verdicts"]]
        ks = [int(k) for k in r["pass"]]
        mine = benchmark_metrics(verdicts, ks)
        avg = next(v for k, v in mine.items() if k.startswith("avg@"))
        assert avg == pytest.approx(100 * r["avg"], abs=1e-9)
        for k, theirs in r["pass"].items():
            assert mine[f"pass@{k}"] == pytest.approx(100 * theirs, abs=1e-9)
