"""The demo data: built once, idempotent, and loadable by the training-side readers."""
import json
import time

import pytest

from infir.data.demo import EVAL_PROBLEMS, ensure_demo_data
from infir.data.mixture import load_resolved
from infir.data.pretrain import build_pretrain_datasets
from infir.data.sft import build_sft_dataset

pytestmark = pytest.mark.filterwarnings("ignore:Transformer Engine and Apex")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    return root, ensure_demo_data(root, progress=False)


def test_paths_and_idempotence(demo):
    root, paths = demo
    assert set(paths) >= {"pretrain", "shakespeare", "pretrain_valid", "reasoning", "mixture", "sft1", "sft2", "eval",
                          "tokenizer"}
    bins = {p: (root / p).stat().st_mtime_ns for p in ("pretrain/shakespeare_train.bin", "sft/sft1.bin")}
    start = time.time()
    assert ensure_demo_data(root, progress=False) == paths
    assert time.time() - start < 5
    assert bins == {p: (root / p).stat().st_mtime_ns for p in bins}  # nothing rewritten


def test_readers_load_the_demo_data(demo):
    _, paths = demo
    train, valid = build_pretrain_datasets(paths["shakespeare"], 128, paths["tokenizer"], valid_blend=paths["pretrain_valid"])
    assert len(train) > 5000 and len(valid) > 200
    # What stage=cpt reads: the phases in order, sized by the loop's sample count.
    cpt, _ = build_pretrain_datasets(paths["pretrain"], 128, paths["tokenizer"], train_samples=2000, valid_samples=8,
                                     valid_blend=paths["pretrain_valid"])
    assert cpt.sequential and [b[0] for b in cpt.phase_bounds] == ["general", "reasoning"] and len(cpt) == 2000
    phases = load_resolved(paths["mixture"])
    assert [p.name for p in phases] == ["general", "reasoning"]
    assert phases[1].sources[1].prefix == paths["reasoning"] and phases[1].sources[1].weight > phases[0].sources[1].weight
    for name in ("sft1", "sft2"):
        ds = build_sft_dataset(paths[name], 256)
        item = ds[0]
        assert set(item) == {"tokens", "labels", "loss_mask", "position_ids"}
        assert item["loss_mask"].sum() > 0 and int((item["position_ids"] == 0).sum()) >= 2


def test_eval_problems_are_held_out_of_every_training_file(demo):
    root, paths = demo
    eval_questions = {json.loads(line)["question"] for line in open(paths["eval"])}
    assert len(eval_questions) == EVAL_PROBLEMS
    for raw in ("sft1.jsonl", "sft2.jsonl", "arithmetic.jsonl"):
        text = (root / "raw" / raw).read_text()
        assert not any(q in text for q in eval_questions), raw
