"""Benchmark declarations: the registry, each shipped sample set through its real loader, GPQA
shuffling, LiveCodeBench's date window, local parquet, and the hub call each one makes."""
import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infir.eval.benchmarks import get_benchmark, load_problems, registry

DECLARED = {"aime24", "aime25", "gpqa_diamond", "livecodebench_v5", "math500", "gsm8k", "demo_arith"}


def test_registry_declares_every_benchmark():
    assert set(registry()) == DECLARED


@pytest.mark.parametrize("name", sorted(DECLARED - {"demo_arith"}))
def test_sample_set_loads_and_its_gold_grades(name):
    from infir.eval import grade

    bench = get_benchmark(name)
    problems = load_problems(bench, "samples")
    assert len(problems) >= 3
    for p in problems:
        assert p.prompt and p.id
        if bench.grader == "code":
            assert p.code_task is not None and p.code_task.tests
        else:
            assert "\\boxed{}" in p.prompt
            assert grade(name, f"</think>The answer is \\boxed{{{p.answer}}}.", p.answer)


def test_reference_sampling_is_the_design_one():
    for name, (n, tokens) in {"aime24": (32, 31_000), "aime25": (32, 31_000), "gpqa_diamond": (8, 26_000),
                              "livecodebench_v5": (8, 27_000)}.items():
        s = get_benchmark(name).sampling
        assert (s.n, s.max_new_tokens, s.temperature, s.top_p) == (n, tokens, 0.65, 0.95)


def test_gpqa_choices_are_shuffled_by_the_seed_and_answer_follows():
    bench = get_benchmark("gpqa_diamond")
    records = [json.loads(line) for line in bench.sample_file.read_text().splitlines()]
    letters_by_seed = []
    for seed in range(6):
        problems = load_problems(bench, "samples", seed=seed)
        assert problems == load_problems(bench, "samples", seed=seed)  # deterministic
        for record, problem in zip(records, problems):
            line = [l for l in problem.prompt.splitlines() if l.startswith(f"({problem.answer}) ")][-1]  # past the examples
            assert line == f"({problem.answer}) {record['Correct Answer'].strip()}"
        letters_by_seed.append(tuple(p.answer for p in problems))
    assert len(set(letters_by_seed)) > 1  # the seed moves the correct option


def test_livecodebench_keeps_only_its_date_window():
    problems = load_problems(get_benchmark("livecodebench_v5"), "samples")
    assert [p.id for p in problems] == ["sample-abc-a", "sample-lc-1", "sample-abc-b"]  # sample-old is 2024-03
    styles = Counter(p.code_task.style for p in problems)
    assert styles == {"stdin": 2, "functional": 1}
    assert len(problems[0].code_task.tests) == 3  # 1 public + 2 private (compressed)


def test_demo_arith_uses_held_out_problems():
    from infir.data.demo import EVAL_SEED, arithmetic_problems

    problems = load_problems(get_benchmark("demo_arith"), limit=5)
    expected = arithmetic_problems(64, seed=EVAL_SEED)[:5]
    assert [p.answer for p in problems] == [r["answer"] for r in expected]
    assert [p.prompt for p in problems] == [r["question"] for r in expected]


def test_local_parquet_and_directory_sources(tmp_path):
    bench = get_benchmark("math500")
    rows = [json.loads(line) for line in bench.sample_file.read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "math500.parquet")
    from_parquet = load_problems(bench, str(tmp_path / "math500.parquet"))
    assert from_parquet == load_problems(bench, "samples")
    assert load_problems(bench, str(tmp_path), limit=2) == from_parquet[:2]


def test_missing_source_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither 'hub', 'samples', 'bundle:DIR' nor an existing path"):
        load_problems(get_benchmark("aime24"), str(tmp_path / "nope.jsonl"))


@pytest.mark.parametrize("name,hf_id,configs,split", [
    ("aime24", "HuggingFaceH4/aime_2024", [None], "train"),
    ("aime25", "opencompass/AIME2025", ["AIME2025-I", "AIME2025-II"], "test"),
    ("math500", "HuggingFaceH4/MATH-500", [None], "test"),
    ("gsm8k", "openai/gsm8k", ["main"], "test"),
    ("gpqa_diamond", "Idavidrein/gpqa", ["gpqa_diamond"], "train"),
])
def test_hub_source_reads_the_documented_dataset(fake_hub, name, hf_id, configs, split):
    bench = get_benchmark(name)
    problems = load_problems(bench, "hub")
    assert fake_hub.calls == [("load_dataset", hf_id, c, split) for c in configs]
    assert problems == load_problems(bench, "samples")


def test_livecodebench_is_read_from_its_raw_files_through_huggingface_hub(fake_hub):
    """Its repository's loading script does not run under datasets >= 4; the jsonl files do, in order."""
    bench = get_benchmark("livecodebench_v5")
    problems = load_problems(bench, "hub")
    files = ["test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl"]
    assert fake_hub.calls == [("hf_hub_download", "livecodebench/code_generation_lite", f, "dataset") for f in files]
    assert problems == load_problems(bench, "samples")


def test_hub_failure_says_how_to_go_offline(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match="sources.aime24=/path/to.jsonl"):
        load_problems(get_benchmark("aime24"), "hub")
