"""`infir-eval bundle DIR` through a fake hub (tests/eval/conftest.py), then `source=bundle:DIR` with the
hub out of reach: the same problems in the same order as online, the manifest's counts and checksums,
a tampered or incomplete bundle refused in one line, an interrupted bundle resumed."""
import json

import pytest
from cli_messages import messages

from infir.eval.benchmarks import get_benchmark, load_problems
from infir.eval.bundle import sha256
from infir.eval.cli import BUNDLED, main
from infir.eval.config import load_config
from infir.eval.runner import evaluate


@pytest.fixture
def bundle(fake_hub, tmp_path, capsys):
    directory = tmp_path / "bundle"
    assert main(["bundle", str(directory)]) == 0
    capsys.readouterr()
    return directory


def test_the_bundle_holds_every_benchmark_with_counts_and_checksums(bundle, fake_hub):
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert list(manifest["benchmarks"]) == list(BUNDLED)
    for name, entry in manifest["benchmarks"].items():
        path = bundle / entry["file"]
        assert entry["sha256"] == sha256(path)
        assert entry["records"] == len(path.read_text().splitlines()) == len(load_problems(get_benchmark(name), "samples"))
        assert entry["hf_id"] == get_benchmark(name).hf_id
    lcb = [json.loads(line)["question_id"] for line in (bundle / "livecodebench_v5.jsonl").read_text().splitlines()]
    assert "sample-old" not in lcb  # outside InfiR2's window: not carried


@pytest.mark.parametrize("name", BUNDLED)
def test_offline_problems_are_the_online_ones_in_the_same_order(bundle, fake_hub, name):
    bench = get_benchmark(name)
    online = load_problems(bench, "hub", seed=3)
    fake_hub.offline = True
    assert load_problems(bench, f"bundle:{bundle}", seed=3) == online
    with pytest.raises(RuntimeError, match="source=bundle:DIR"):
        load_problems(bench, "hub")


class EchoBackend:
    """Answers every prompt with the same text: the run's files then differ only in their problems."""

    def generate(self, prompts, sampling, seed):
        from infir.eval.backends import Completion

        return [[Completion(text="</think>\\boxed{1}", num_tokens=3, finish_reason="stop")] * sampling.n for _ in prompts]


def _run_rows(model, out, source_override):
    cfg = load_config([f"model={model}", f"out_dir={out}", "benchmarks=[aime24,gpqa_diamond,livecodebench_v5]",
                       "sampling.n=1", "pass_k=[1]", source_override])
    evaluate(cfg, backend=EchoBackend())
    return {name: [(r["problem_id"], r["prompt"]) for r in map(json.loads, (out / "samples" / f"{name}.jsonl").open())]
            for name in ("aime24", "gpqa_diamond", "livecodebench_v5")}


def test_an_offline_run_on_the_bundle_evaluates_what_the_online_run_did(bundle, fake_hub, tiny_model_dir, tmp_path):
    online = _run_rows(tiny_model_dir, tmp_path / "online", "source=hub")
    fake_hub.offline = True
    assert _run_rows(tiny_model_dir, tmp_path / "offline", f"sources=bundle:{bundle}") == online


def test_a_tampered_bundle_is_refused_in_one_line_naming_the_file(bundle, tiny_model_dir, capsys):
    path = bundle / "aime24.jsonl"
    path.write_text(path.read_text().replace('"answer": "', '"answer": "1', 1))
    assert main(["run", f"model={tiny_model_dir}", "benchmarks=[aime24]", f"source=bundle:{bundle}"]) == 2
    (line,) = messages(capsys.readouterr().err)
    assert f"{path} does not match the bundle's manifest" in line and f"infir-eval bundle {bundle}" in line
    with pytest.raises(ValueError, match="does not match the bundle's manifest"):
        load_problems(get_benchmark("aime24"), f"bundle:{bundle}")


def test_a_benchmark_the_bundle_lacks_says_how_to_add_it(bundle, tiny_model_dir, capsys):
    assert main(["run", f"model={tiny_model_dir}", "benchmarks=[gsm8k]", f"sources.gsm8k=bundle:{bundle}"]) == 2
    (line,) = messages(capsys.readouterr().err)
    assert f"bundle {bundle} has no gsm8k" in line and "--benchmarks gsm8k" in line


def test_an_interrupted_bundle_resumes_with_what_it_lacks(fake_hub, tmp_path, capsys):
    directory = tmp_path / "bundle"
    fake_hub.offline = True
    assert main(["bundle", str(directory)]) == 2
    (line,) = messages(capsys.readouterr().err)
    assert "aime24: could not load HuggingFaceH4/aime_2024" in line and "source=bundle:DIR" in line
    assert not list(directory.glob("*.jsonl*"))  # nothing half-written
    fake_hub.offline = False
    assert main(["bundle", str(directory), "--benchmarks", "aime24", "math500"]) == 0
    fake_hub.calls.clear()
    assert main(["bundle", str(directory), "--benchmarks", "aime24", "math500", "aime25"]) == 0
    assert {c[1] for c in fake_hub.calls} == {"opencompass/AIME2025"}  # the others are there, intact
    assert "aime24: already in" in capsys.readouterr().out
