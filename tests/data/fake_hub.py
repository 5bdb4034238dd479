"""A local "hub": each dataset of data_prep/mixtures/*.yaml as a folder laid out like its repository
(README.md configs, parquet or jsonl files, the columns of the real dataset), holding generated text.

    build_fake_hub(DIR, rows=...) -> DIR/<hub id>/...   (what `infir-prep fetch --from-dir DIR` reads)

Stack-Edu rows carry a blob id and no text, as on the hub; ``swh_blobs(DIR)`` maps blob ids to the file
contents the test's Software Heritage stand-in returns (one blob is absent, as some are).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

WORDS = ("the model reads tokens from every source and counts them once while a shard fills up with "
         "documents about code data math proofs notebooks issues and answers").split()
STACK_EDU_LANGUAGES = ("Python", "Cpp", "Java", "JavaScript", "TypeScript", "C", "CSharp", "Go", "Rust", "PHP",
                       "Ruby", "Swift", "SQL", "Shell", "Markdown")


def _text(rng: random.Random, low: int = 20, high: int = 90) -> str:
    lines = []
    for _ in range(rng.randint(1, 4)):
        lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high) // 2)))
    return "\n".join(lines)


def _readme(path: Path, configs: dict[str, str]) -> None:
    lines = ["---", "configs:"]
    for name, glob in configs.items():
        lines += [f"- config_name: {name}", "  data_files:", "  - split: train", f"    path: {glob}"]
    (path / "README.md").write_text("\n".join(lines + ["---", "# a local copy for tests", ""]))


def _parquet(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=17)


def _fineweb(root: Path, rng: random.Random, rows: int) -> None:
    repo = root / "HuggingFaceFW" / "fineweb"
    for f in range(2):
        batch = [{"text": _text(rng), "id": f"<urn:uuid:{f}-{i}>", "dump": "CC-MAIN-2024-10",
                  "url": f"https://example.org/{f}/{i}", "date": "2024-02-20T00:00:00Z",
                  "file_path": "s3://commoncrawl/x.warc.gz", "language": "en", "language_score": 0.93,
                  "token_count": 100} for i in range(rows // 2)]
        batch[3]["text"] = "   "  # an empty document: skipped, counted
        _parquet(repo / "sample" / "100BT" / f"00{f}_00000.parquet", batch)
    _readme(repo, {"sample-100BT": "sample/100BT/*", "default": "data/*/*"})
    _parquet(repo / "data" / "CC-MAIN-2024-10" / "000_00000.parquet", [{"text": "unused", "id": "x"}])


def _nemotron(root: Path, rng: random.Random, rows: int) -> None:
    repo = root / "nvidia" / "Nemotron-CC-v2"
    batch = [{"id": f"nemo-{i}", "text": _text(rng), "warc_record_id": f"w{i}", "quality": "high"} for i in range(rows)]
    _parquet(repo / "High-Quality" / "part_000000.parquet", batch)
    _readme(repo, {"High-Quality": "High-Quality/*.parquet"})


def _stack_edu(root: Path, rng: random.Random, rows: int) -> dict[str, str]:
    repo, blobs = root / "HuggingFaceTB" / "stack-edu", {}
    for lang in STACK_EDU_LANGUAGES:
        batch = []
        for i in range(max(2, rows // len(STACK_EDU_LANGUAGES))):
            blob = f"{lang.lower()}{i:04d}" + "0" * 30
            blobs[blob] = f"# {lang} file {i}\n" + _text(rng)
            batch.append({"blob_id": blob, "language": lang, "repo_name": f"o/r{i}", "path": f"src/f{i}",
                          "src_encoding": "UTF-8", "length_bytes": 100, "score": 3.2, "int_score": 3,
                          "detected_licenses": ["MIT"], "license_type": "permissive"})
        _parquet(repo / "data" / lang / "train-00000-of-00001.parquet", batch)
    del blobs["python0001" + "0" * 30]  # absent from the bucket
    _readme(repo, {lang: f"data/{lang}/train-*" for lang in STACK_EDU_LANGUAGES})
    (root / "swh_blobs.json").write_text(json.dumps(blobs))
    return blobs


def _issues_kaggle(root: Path, rng: random.Random, rows: int) -> None:
    repo = root / "HuggingFaceTB" / "issues-kaggle-notebooks"
    _parquet(repo / "kaggle" / "train-00000.parquet",
             [{"file_id": f"k{i}", "text": "<jupyter_code>" + _text(rng), "kaggle_dataset_name": "d"} for i in range(rows)])
    _parquet(repo / "issues" / "train-00000.parquet",
             [{"repo_name": "o/r", "issue_id": i, "text": "<issue_start>" + _text(rng)} for i in range(rows)])
    _readme(repo, {"kaggle": "kaggle/*", "issues": "issues/*"})


def _am(root: Path, hub: str, rng: random.Random, rows: int, teacher: str) -> None:
    """The AM sets' layout: one jsonl per category, ShareGPT turns whose `info` differs by category."""
    repo = root / hub
    repo.mkdir(parents=True, exist_ok=True)
    for category, info in (("math", {"ground_truth": "42", "verify_score": 1.0}),
                           ("code", {"test_case": {"inputs": [[1, 2]], "outputs": [3]}, "ppl": 1.7})):
        with open(repo / f"{category}.jsonl", "w") as f:
            for i in range(rows // 2):
                question, think, answer = _text(rng, 10, 30), _text(rng, 20, 60), _text(rng, 5, 15)
                turns = [{"from": "human", "value": question, "info": {"source": "x", "category": category, **info}},
                         {"from": "assistant", "value": f"<think>\n{think}\n</think>\n<answer>\n{answer}\n</answer>",
                          "info": {"think_content": think, "answer_content": answer, "model_name": teacher}}]
                if i == 2:
                    turns[0]["from"] = "narrator"  # an unknown role: skipped, counted
                f.write(json.dumps({"system": "You are a helpful assistant.", "conversations": turns}) + "\n")


def _infialign(root: Path, hub: str, rng: random.Random, rows: int) -> None:
    repo = root / hub
    repo.mkdir(parents=True, exist_ok=True)
    with open(repo / "train.jsonl", "w") as f:
        for i in range(rows):
            messages = [{"role": "user", "content": _text(rng, 10, 30)},
                        {"role": "assistant", "content": "<think>" + _text(rng, 20, 40) + "</think>" + _text(rng, 5, 10)}]
            f.write(json.dumps({"messages": messages, "id": i}) + "\n")


def build_fake_hub(root: Path, rows: int = 400, seed: int = 0) -> Path:
    """Every source of the two fetch specs under ``root``; the kaggle/issues set is small (read to its end)."""
    rng = random.Random(seed)
    _fineweb(root, rng, rows)
    _nemotron(root, rng, rows)
    _stack_edu(root, rng, rows)
    _issues_kaggle(root, rng, max(4, rows // 20))
    _am(root, "a-m-team/AM-DeepSeek-R1-0528-Distilled", rng, rows, "deepseek-r1-0528")
    _am(root, "a-m-team/AM-Qwen3-Distilled", rng, rows, "qwen3_235b_a22b")
    _infialign(root, "InfiX-ai/InfiAlign-SFT-92k", rng, rows // 8)
    _infialign(root, "InfiX-ai/InfiAlign-SFT-165k", rng, rows // 6)
    return root


def swh_blobs(root: Path) -> dict[str, str]:
    return json.loads((root / "swh_blobs.json").read_text())
