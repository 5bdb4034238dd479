"""Mixtures: a phased YAML spec -> megatron blends whose realised token shares match the spec."""
import json
from pathlib import Path
from collections import Counter

import pytest
import yaml

from infir.data import DEMO_TOKENIZER
from infir.data.arithmetic import arithmetic_problems, as_text
from infir.data.cli import main as prep_main
from infir.data.mixture import MixtureError, load_resolved, load_spec, phase_schedule
from infir.data.pretrain import build_phase_datasets
from infir.data.shakespeare import shakespeare_documents
from infir.data.tokenize_corpus import tokenize_to_indexed

pytestmark = pytest.mark.filterwarnings("ignore:Transformer Engine and Apex")

SPEC = """
name: test_mix
phases:
  - name: general
    tokens: 200000
    sources:
      - {name: plays, prefix: data/plays, weight: 5}
      - {name: math, prefix: data/math, weight: 3}
      - {name: more_plays, prefix: data/more_plays, weight: 2}
  - name: reasoning
    sources:
      - {name: plays, prefix: data/plays, tokens: 30000}
      - {name: math, prefix: data/math, tokens: 150000}
      - {name: more_plays, prefix: data/more_plays, tokens: 20000}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    scenes = [d["text"] for d in list(shakespeare_documents())[:40]]
    texts = {"plays": scenes[:20], "more_plays": scenes[20:],
             "math": [as_text(p) for p in arithmetic_problems(400, 3)]}
    for name, docs in texts.items():
        src = root / f"{name}.jsonl"
        src.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
        tokenize_to_indexed([src], root / "data" / name, DEMO_TOKENIZER, progress=False)
    (root / "spec.yaml").write_text(SPEC)
    return root


def test_realised_token_shares_within_one_percent_per_phase(built):
    phases = load_spec(built / "spec.yaml")
    assert [p.name for p in phases] == ["general", "reasoning"]
    assert [round(s.weight, 6) for s in phases[0].sources] == [0.5, 0.3, 0.2]
    assert [round(s.weight, 6) for s in phases[1].sources] == [0.15, 0.75, 0.1]
    S = 16
    for phase in phases:
        train, _ = build_phase_datasets(phase, S, DEMO_TOKENIZER, global_batch=8, valid_samples=10,
                                        split="90,10,0", cache_dir=built / "cache")
        assert len(train) >= 10_000
        tokens = Counter()
        for i in range(len(train)):
            item = train[i]
            tokens[int(item["dataset_id"])] += item["tokens"].numel()
        total = sum(tokens.values())
        for j, source in enumerate(phase.sources):
            assert abs(tokens[j] / total - source.weight) < 0.01, (phase.name, source.name, tokens[j] / total)


def test_cli_writes_the_resolved_phases(built, capsys):
    out = built / "resolved.yaml"
    assert prep_main(["mixture", "--spec", str(built / "spec.yaml"), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "phase general: 200,000 tokens: plays 50.0%" in printed
    data = yaml.safe_load(out.read_text())
    assert data["name"] == "test_mix"
    assert data["phases"][1]["tokens"] == 200000
    assert data["phases"][0]["blend"][0][0] == str(built / "data" / "plays")
    plays = data["phases"][0]["sources"][0]
    assert plays["available_tokens"] > 0 and plays["epochs"] == pytest.approx(0.5 * 200000 / plays["available_tokens"], rel=1e-3)
    assert [p.name for p in load_resolved(out)] == ["general", "reasoning"]


def test_phase_schedule_runs_phases_back_to_back(built):
    phases = load_spec(built / "spec.yaml")
    sched = phase_schedule(phases, seq_length=16, global_batch=8)
    assert sched[0]["start"] == 0 and sched[0]["end"] == sched[1]["start"]
    for s, p in zip(sched, phases):
        assert (s["end"] - s["start"]) * 16 * 8 >= p.tokens > (s["end"] - s["start"] - 1) * 16 * 8


@pytest.mark.parametrize("spec, message", [
    ("phases: []", "non-empty list 'phases'"),
    ("phases: [{name: a, tokens: 10, sources: [{prefix: x, weight: 1}, {prefix: y, tokens: 5}]}]", "exactly one of"),
    ("phases: [{name: a, sources: [{prefix: x, weight: 1}]}]", "need the phase's 'tokens'"),
    ("phases: [{name: a, tokens: 10, sources: [{weight: 1}]}]", r"sources\[0\] needs 'prefix'"),
    ("phases: [{name: a, tokens: 10, sources: [{prefix: x, weight: -1}]}]", r"weight must be a finite number >= 0"),
    ("phases: [{name: a, tokens: 10, sources: [{prefix: x, tokens: 4}]}]", "budgets sum to 4"),
    ("phases: [{name: a, tokens: 1, sources: [{prefix: x, weight: 1}]}, {name: a, tokens: 1, sources: [{prefix: x, weight: 1}]}]",
     "used twice"),
    ("phases: [", "not valid YAML"),
])
def test_spec_errors_name_the_field(tmp_path, spec, message):
    (tmp_path / "s.yaml").write_text(spec)
    with pytest.raises(MixtureError, match=message):
        load_spec(tmp_path / "s.yaml")


def test_a_split_without_validation_documents_is_refused(built):
    phase = load_spec(built / "spec.yaml")[0]
    with pytest.raises(ValueError, match="20 documents.*validation part with none"):
        build_phase_datasets(phase, 16, DEMO_TOKENIZER, global_batch=8, valid_samples=10, split="99,1,0")


def test_a_resolved_mixture_file_runs_its_phases_in_order(built):
    from infir.data.pretrain import build_pretrain_datasets

    out = built / "resolved_for_phases.yaml"
    assert prep_main(["mixture", "--spec", str(built / "spec.yaml"), "--output", str(out)]) == 0
    phases = load_resolved(out)
    train, valid = build_pretrain_datasets(out, 16, DEMO_TOKENIZER, train_samples=20_000, valid_samples=10,
                                           split="90,10,0", cache_dir=built / "cache")
    assert train.sequential and len(train) == 20_000 and valid is not None
    assert [(n, a, b) for n, a, b in train.phase_bounds] == [("general", 0, 10_000), ("reasoning", 10_000, 20_000)]
    for (name, start, end), phase in zip(train.phase_bounds, phases):
        ids = Counter(int(train[i]["dataset_id"]) for i in range(start, end))
        for j, source in enumerate(phase.sources):
            assert abs(ids[j] / (end - start) - source.weight) < 0.01, (name, source.name)
    with pytest.raises(IndexError):
        train[20_000]


def test_a_relative_base_dir_resolves_each_prefix_once(tmp_path, monkeypatch):
    # The demo built under a relative root wrote "root/root/pretrain/..." prefixes: every run then failed.
    from infir.data.mixture import parse_mixture

    monkeypatch.chdir(tmp_path)
    phases = parse_mixture(yaml.safe_load(SPEC), Path("demo"))
    assert {str(s.prefix) for p in phases for s in p.sources} == {"demo/data/plays", "demo/data/math", "demo/data/more_plays"}
