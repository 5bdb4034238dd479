"""Every console script, fed a missing, empty, truncated, corrupt or wrong-type input, fails: a non-zero
exit, one line on stderr naming the input or the key, no Python traceback, and no file written (so
nothing that looks like a dataset, a checkpoint, a model, a summary or a report).

The scripts' main functions run in this process (an `infir-train` subprocess costs ~10 s of imports);
their exit code and stderr are what a user sees. argparse's own errors (a wrong-type flag) keep its
usage line above the one error line, as every argparse tool does.
"""
from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from cli_messages import messages

from infir.data import DEMO_TOKENIZER

pytestmark = pytest.mark.filterwarnings("ignore:Transformer Engine and Apex")

# --------------------------------------------------------------------------- good inputs, damaged per case
@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """One sound input of each kind: an HF model, an infir checkpoint, a pretraining dataset, a
    training run and an eval summary."""
    from safetensors.torch import save_file

    from infir.data.tokenize_corpus import tokenize_to_indexed
    from infir.model.convert import hf_shapes, hf_to_mcore
    from infir.model.hf_config import hf_config
    from infir.model.qwen import QwenSize

    root = tmp_path_factory.mktemp("good")
    size = QwenSize(hidden=32, layers=1, heads=2, kv_heads=1, ffn=64, vocab=128, tied=True, max_positions=64)
    hf_config(size).save_pretrained(root / "hf")
    save_file({k: torch.randn(s) for k, s in hf_shapes(size).items()}, str(root / "hf" / "model.safetensors"))
    hf_to_mcore(root / "hf", root / "ckpt")
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": f"document {i} " * 10}) + "\n" for i in range(10)))
    tokenize_to_indexed([root / "docs.jsonl"], root / "data" / "pretrain", DEMO_TOKENIZER, progress=False)
    run = root / "runs" / "tiny-bf16-cpt"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "consumed_tokens": 10 * s, "loss": 5.0 / s}) + "\n"
                                               for s in range(1, 11)))
    (run / "summary.json").write_text(json.dumps({"run_name": "tiny-bf16-cpt", "status": "finished"}))
    (root / "eval").mkdir()
    (root / "eval" / "summary.json").write_text(json.dumps({"label": "x", "benchmarks": {"b": {"avg@1": 1.0}}}))
    return root


def _truncate(path: Path, keep: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])
    return path


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _damaged(good: Path, tmp: Path, name: str, inner: str, damage) -> Path:
    """A copy of good/`name` in `tmp` whose file `inner` went through `damage`."""
    shutil.copytree(good / name, tmp / name)
    damage(tmp / name / inner)
    return tmp / name


def _init_from(tmp: Path, good: Path, inner: str, damage, names: str) -> tuple[list[str], str]:
    """A training run started from a copy of the good checkpoint whose file `inner` went through `damage`."""
    return _pretrain(good / "data" / "pretrain", f"init_from={_damaged(good, tmp, 'ckpt', inner, damage)}"), names


def _meta_tp(tp: int):
    """A meta.json that names `tp` model shards (the checkpoint holds one)."""
    return lambda path: path.write_text(json.dumps({**json.loads(path.read_text()), "tp": tp}))


def _garbage(data: bytes):
    return lambda path: path.write_bytes(data)


def _truncated_gzip(path: Path) -> Path:
    data = gzip.compress(b"".join(json.dumps({"text": f"line {i}"}).encode() + b"\n" for i in range(2000)))
    return _write(path, data[:len(data) // 2])


def _dataset(good: Path, tmp: Path, suffix: str = ".bin", damage=None) -> str:
    shutil.copytree(good / "data", tmp / "data")
    if damage is not None:
        damage(tmp / "data" / f"pretrain{suffix}")
    return str(tmp / "data" / "pretrain")


def _empty_dataset(tmp: Path) -> str:
    from infir.data.tokenize_corpus import megatron_indexed

    builder = megatron_indexed().IndexedDatasetBuilder(str(tmp / "empty.bin"))
    builder.finalize(str(tmp / "empty.idx"))
    return str(tmp / "empty")


# --------------------------------------------------------------------------- the cases
# Each case: script -> setup(tmp, good) -> (argv, what its error line must say). "{out}" in argv is
# tmp/out, where the script would write.
TOK = str(DEMO_TOKENIZER)
META, SHARD = "iter_0000000/meta.json", "iter_0000000/model_tp0.safetensors"


def _prep(kind: str, src, tokenizer=TOK, seq_length: str = "64") -> list[str]:
    argv = [kind, "--input", str(src), "--output", "{out}/o", "--tokenizer", str(tokenizer)]
    return argv + (["--seq-length", seq_length] if kind == "sft" else ["--workers", "1"])


def _train(*overrides) -> list[str]:
    return ["data=custom", f"data.tokenizer={TOK}", *overrides, "run_dir={out}/run"]


def _pretrain(prefix, *overrides) -> list[str]:
    return _train(f"data.sources.pretrain={prefix}", *overrides)


def _run_dir(tmp: Path, metrics: bytes) -> str:
    return str(_write(tmp / "runs" / "tiny-bf16-cpt" / "metrics.jsonl", metrics).parent)


def _eval(model, *overrides) -> list[str]:
    return ["run", f"model={model}", *overrides, "out_dir={out}/eval"]


CPT_SPEC = Path(__file__).resolve().parents[1] / "data_prep" / "mixtures" / "infir2_cpt.yaml"


def _fetch(spec, *flags) -> list[str]:
    return ["fetch", "--spec", str(spec), "--root", "{out}", "--tokenizer", TOK, *flags]


def _tampered_bundle(tmp: Path) -> Path:
    """A bundle of AIME 2024's sample problems, one answer changed after it was written."""
    from infir.eval.benchmarks import get_benchmark
    from infir.eval.bundle import write_records

    sample = get_benchmark("aime24").sample_file
    write_records(tmp / "bundle", "aime24", map(json.loads, sample.read_text().splitlines()), {})
    path = tmp / "bundle" / "aime24.jsonl"
    path.write_text(path.read_text().replace('"answer": "', '"answer": "9', 1))
    return tmp / "bundle"


CASES = {
    # ---- infir-prep
    "prep pretrain: missing input": ("infir-prep", lambda t, g: (
        _prep("pretrain", t / "nope.jsonl"), f"input {t / 'nope.jsonl'} does not exist")),
    "prep pretrain: empty input": ("infir-prep", lambda t, g: (
        _prep("pretrain", _write(t / "e.jsonl", b"")), f"no document in {t / 'e.jsonl'}: the input is empty")),
    "prep pretrain: every line bad": ("infir-prep", lambda t, g: (
        _prep("pretrain", _write(t / "b.jsonl", b'{"text": 1}\n\x00\xff\n')), f"no usable document in {t / 'b.jsonl'}")),
    "prep pretrain: truncated gzip": ("infir-prep", lambda t, g: (
        _prep("pretrain", _truncated_gzip(t / "t.jsonl.gz")), f"{t / 't.jsonl.gz'}: not a readable gzip file")),
    "prep pretrain: corrupt parquet": ("infir-prep", lambda t, g: (
        _prep("pretrain", _write(t / "c.parquet", b"PAR1" + b"\x00" * 64)),
        f"{t / 'c.parquet'}: not a readable parquet")),
    "prep pretrain: a csv": ("infir-prep", lambda t, g: (
        _prep("pretrain", _write(t / "x.csv", b"a,b\n")), f"{t / 'x.csv'}: unsupported input format")),
    "prep pretrain: a plain directory": ("infir-prep", lambda t, g: (
        _prep("pretrain", t), f"{t} is a directory but not a saved HF dataset")),
    "prep pretrain: corrupt tokenizer": ("infir-prep", lambda t, g: (
        _prep("pretrain", g / "docs.jsonl", _write(t / "tok" / "tokenizer.json", b'{"x": ').parent),
        f"{t / 'tok' / 'tokenizer.json'} is not a readable HF tokenizer file")),
    "prep pretrain: tokenizer is a file": ("infir-prep", lambda t, g: (
        _prep("pretrain", g / "docs.jsonl", g / "docs.jsonl"), f"no tokenizer at {g / 'docs.jsonl'}")),
    "prep sft: missing input": ("infir-prep", lambda t, g: (
        _prep("sft", t / "nope.jsonl"), f"input {t / 'nope.jsonl'} does not exist")),
    "prep sft: empty input": ("infir-prep", lambda t, g: (
        _prep("sft", _write(t / "e.jsonl", b"")), f"no sample in {t / 'e.jsonl'}: the input is empty")),
    "prep sft: every line bad": ("infir-prep", lambda t, g: (
        _prep("sft", _write(t / "b.jsonl", b'{"prompt": "q"}\n[1, 2]\n')), f"no usable sample in {t / 'b.jsonl'}")),
    "prep sft: truncated gzip": ("infir-prep", lambda t, g: (
        _prep("sft", _truncated_gzip(t / "t.jsonl.gz")), f"{t / 't.jsonl.gz'}: not a readable gzip file")),
    "prep sft: seq-length not a number": ("infir-prep", lambda t, g: (
        _prep("sft", g / "docs.jsonl", seq_length="many"), "argument --seq-length: invalid int value: 'many'")),
    "prep sft: seq-length too small": ("infir-prep", lambda t, g: (
        _prep("sft", g / "docs.jsonl", seq_length="1"), "seq_length must be >= 2, got 1")),
    "prep fetch: missing spec": ("infir-prep", lambda t, g: (
        _fetch(t / "nope.yaml"), f"fetch spec {t / 'nope.yaml'} does not exist")),
    "prep fetch: a mixture without sources": ("infir-prep", lambda t, g: (
        _fetch(_write(t / "m.yaml", b"phases: [{tokens: 1, sources: [{prefix: a, weight: 1}]}]\n")),
        "a fetch spec needs a mapping 'sources'")),
    "prep fetch: budget not a number": ("infir-prep", lambda t, g: (
        _fetch(CPT_SPEC, "--tokens-per-source", "many"), "not a number of tokens: 'many'")),
    "prep fetch: no local copy": ("infir-prep", lambda t, g: (
        _fetch(CPT_SPEC, "--from-dir", str(t)), "hf download HuggingFaceFW/fineweb --repo-type dataset")),
    # ---- infir-convert
    "convert: missing hf dir": ("infir-convert", lambda t, g: (
        ["hf-to-mcore", "--hf", str(t / "nope"), "--out", "{out}/o"], f"--hf {t / 'nope'}: no such directory")),
    "convert: empty hf dir": ("infir-convert", lambda t, g: (
        ["hf-to-mcore", "--hf", str(t), "--out", "{out}/o"], f"{t / 'config.json'} is missing")),
    "convert: truncated safetensors": ("infir-convert", lambda t, g: (
        ["hf-to-mcore", "--hf", str(_damaged(g, t, "hf", "model.safetensors", _truncate)), "--out", "{out}/o"],
        f"{t / 'hf' / 'model.safetensors'} is not a readable safetensors file")),
    "convert: corrupt config.json": ("infir-convert", lambda t, g: (
        ["hf-to-mcore", "--hf", str(_damaged(g, t, "hf", "config.json", _garbage(b"{oops"))), "--out", "{out}/o"],
        f"{t / 'hf' / 'config.json'} is not valid JSON")),
    "convert: missing checkpoint": ("infir-convert", lambda t, g: (
        ["mcore-to-hf", "--ckpt", str(t / "nope"), "--out", "{out}/o"], f"no infir checkpoint at {t / 'nope'}")),
    "convert: truncated shard": ("infir-convert", lambda t, g: (
        ["mcore-to-hf", "--ckpt", str(_damaged(g, t, "ckpt", SHARD, _truncate)), "--out", "{out}/o"],
        f"{t / 'ckpt' / SHARD} is not a readable safetensors file")),
    "convert: truncated meta.json": ("infir-convert", lambda t, g: (
        ["mcore-to-hf", "--ckpt", str(_damaged(g, t, "ckpt", META, _truncate)), "--out", "{out}/o"],
        f"{t / 'ckpt' / META} is not valid JSON")),
    "convert: meta.json of the wrong type": ("infir-convert", lambda t, g: (
        ["mcore-to-hf", "--ckpt", str(_damaged(g, t, "ckpt", META, _garbage(b"[]"))), "--out", "{out}/o"],
        f"{t / 'ckpt' / META} holds a JSON list, not an object")),
    "convert: --fp8 on weights not trained in FP8": ("infir-convert", lambda t, g: (
        ["mcore-to-hf", "--ckpt", str(g / "ckpt"), "--out", "{out}/o", "--fp8"],
        "--fp8 needs a checkpoint trained with an FP8 recipe")),
    "convert: tp not a number": ("infir-convert", lambda t, g: (
        ["hf-to-mcore", "--hf", str(g / "hf"), "--out", "{out}/o", "--tp", "two"],
        "argument --tp: invalid int value: 'two'")),
    # ---- infir-compare
    "compare: missing run dir": ("infir-compare", lambda t, g: (
        [str(t / "nope"), "--out", "{out}/report"], f"{t / 'nope'}: no such run directory")),
    "compare: empty folder": ("infir-compare", lambda t, g: ([str(t), "--out", "{out}/report"], f"no runs under {t}")),
    "compare: empty metrics": ("infir-compare", lambda t, g: (
        [_run_dir(t, b""), "--out", "{out}/report"], "no run has logged a training step")),
    "compare: truncated summary": ("infir-compare", lambda t, g: (
        [str(_damaged(g, t, "runs", "tiny-bf16-cpt/summary.json", _truncate)), "--out", "{out}/report"],
        f"{t / 'runs' / 'tiny-bf16-cpt' / 'summary.json'} is not valid JSON")),
    "compare: corrupt metrics line": ("infir-compare", lambda t, g: (
        [_run_dir(t, b'{"step": 1, "loss": 1}\n{oops\n{"step": 2, "loss": 1}\n'), "--out", "{out}/report"],
        f"{t / 'runs' / 'tiny-bf16-cpt' / 'metrics.jsonl'}:2: not a JSON line")),
    "compare: metrics line of the wrong type": ("infir-compare", lambda t, g: (
        [_run_dir(t, b'[1, 2]\n{"step": 2, "loss": 1}\n'), "--out", "{out}/report"],
        f"{t / 'runs' / 'tiny-bf16-cpt' / 'metrics.jsonl'}:1: a JSON list, not an object")),
    "compare: --out is a file": ("infir-compare", lambda t, g: (
        [str(g / "runs"), "--out", str(_write(t / "out" / "report", b"x"))], f"{t / 'out' / 'report'}")),
    # ---- infir-eval
    "eval: no model": ("infir-eval", lambda t, g: (["run", "out_dir={out}/eval"], "infir-eval run needs model=")),
    "eval: missing model": ("infir-eval", lambda t, g: (_eval(t / "nope"), f"model={t / 'nope'}: no such directory")),
    "eval: model is a file": ("infir-eval", lambda t, g: (
        _eval(g / "docs.jsonl"), f"model={g / 'docs.jsonl'}: neither an HF model")),
    "eval: truncated weights": ("infir-eval", lambda t, g: (
        _eval(_damaged(g, t, "hf", "model.safetensors", _truncate)),
        f"{t / 'hf' / 'model.safetensors'} is not a readable safetensors file")),
    "eval: corrupt config.json": ("infir-eval", lambda t, g: (
        _eval(_damaged(g, t, "hf", "config.json", _garbage(b"{"))), f"{t / 'hf' / 'config.json'} is not valid JSON")),
    "eval: corrupt checkpoint meta": ("infir-eval", lambda t, g: (
        _eval(_damaged(g, t, "ckpt", META, _truncate)), f"{t / 'ckpt' / META} is not valid JSON")),
    "eval: unknown benchmark": ("infir-eval", lambda t, g: (
        _eval(g / "hf", "benchmarks=[nope]"), "unknown benchmark 'nope'")),
    "eval: limit not a number": ("infir-eval", lambda t, g: (_eval(g / "hf", "limit=some"), "limit: Value 'some'")),
    "eval: unknown key": ("infir-eval", lambda t, g: (
        _eval(g / "hf", "bogus=1"), "bogus: Key 'bogus' not in 'EvalConfig'")),
    "eval compare: missing run": ("infir-eval", lambda t, g: (
        ["compare", str(t / "nope")], f"{t / 'nope'}: no summary.json")),
    "eval compare: truncated summary": ("infir-eval", lambda t, g: (
        ["compare", str(_damaged(g, t, "eval", "summary.json", _truncate))],
        f"{t / 'eval' / 'summary.json'} is not valid JSON")),
    "eval compare: summary of the wrong type": ("infir-eval", lambda t, g: (
        ["compare", str(_damaged(g, t, "eval", "summary.json", _garbage(b'{"label": "x"}')))],
        f"{t / 'eval' / 'summary.json'} is not an `infir-eval run` summary")),
    "eval: not a bundle": ("infir-eval", lambda t, g: (
        _eval(g / "hf", "benchmarks=[aime24]", f"source=bundle:{t}"), f"{t} is not a benchmark bundle")),
    "eval: bundle file changed": ("infir-eval", lambda t, g: (
        _eval(g / "hf", "benchmarks=[aime24]", f"source=bundle:{_tampered_bundle(t)}"),
        f"{t / 'bundle' / 'aime24.jsonl'} does not match the bundle's manifest")),
    "eval bundle: unknown benchmark": ("infir-eval", lambda t, g: (
        ["bundle", "{out}/bundle", "--benchmarks", "nope"], "unknown benchmark 'nope'")),
    # ---- infir-train
    "train: missing dataset": ("infir-train", lambda t, g: (
        _pretrain(t / "nope"), f"data.sources.pretrain='{t / 'nope'}' is not valid")),
    "train: empty dataset": ("infir-train", lambda t, g: (
        _pretrain(_empty_dataset(t)), f"({t / 'empty'} holds no documents)")),
    "train: truncated .bin": ("infir-train", lambda t, g: (
        _pretrain(_dataset(g, t, ".bin", _truncate)), f"({t / 'data' / 'pretrain.bin'} holds")),
    "train: corrupt .idx": ("infir-train", lambda t, g: (
        _pretrain(_dataset(g, t, ".idx", _garbage(b"\x00" * 100))),
        f"({t / 'data' / 'pretrain.idx'} is not a megatron index")),
    "train: sft source without loss masks": ("infir-train", lambda t, g: (
        _train("stage=sft1", f"data.sources.sft1={_dataset(g, t)}"), f"({t / 'data' / 'pretrain.lossmask.bin'} and")),
    "train: tokenizer is a file": ("infir-train", lambda t, g: (
        _pretrain(g / "data" / "pretrain", f"data.tokenizer={g / 'docs.jsonl'}"),
        f"data.tokenizer='{g / 'docs.jsonl'}' is not valid")),
    "train: corrupt init_from": ("infir-train", lambda t, g: (
        _pretrain(g / "data" / "pretrain", f"init_from={_damaged(g, t, 'ckpt', META, _truncate)}"),
        f"{t / 'ckpt' / META} is not valid JSON")),
    "train: init_from missing a tensor-parallel shard": ("infir-train", lambda t, g: _init_from(
        t, g, META, _meta_tp(2), f"{t / 'ckpt' / 'iter_0000000' / 'model_tp1.safetensors'} is missing")),
    "train: init_from with a corrupt tensor-parallel shard": ("infir-train", lambda t, g: _init_from(
        t, g, SHARD, _truncate, f"{t / 'ckpt' / SHARD} is not a readable safetensors file")),
    "train: lr not a number": ("infir-train", lambda t, g: (
        _pretrain(g / "data" / "pretrain", "stage.lr=fast"), "stage.lr='fast' is not valid: expected a number")),
    "train: negative lr": ("infir-train", lambda t, g: (
        _pretrain(g / "data" / "pretrain", "stage.lr=-1"), "stage.lr=-1.0 is not valid: expected a positive number")),
}


# --------------------------------------------------------------------------- running a script in this process
def _main(script: str):
    if script == "infir-prep":
        from infir.data.cli import main
    elif script == "infir-convert":
        from infir.model.convert import main
    elif script == "infir-compare":
        from infir.report.compare import main
    elif script == "infir-eval":
        from infir.eval.cli import main
    else:
        from infir.train.cli import main as train_main

        def main(argv):
            sys.argv = ["infir-train", *argv]  # Hydra reads the command line itself
            return train_main()
    return main


def _run(script: str, argv: list[str], monkeypatch) -> int:
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    try:
        code = _main(script)(argv)
    except SystemExit as e:
        code = e.code
    return code


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_input_fails_in_one_line_naming_it(case, good, tmp_path, monkeypatch, capsys):
    script, setup = CASES[case]
    argv, names = setup(tmp_path, good)
    out = tmp_path / "out"
    before = _files(tmp_path)
    code = _run(script, [a.replace("{out}", str(out)) for a in argv], monkeypatch)
    captured = capsys.readouterr()
    said = [line for line in messages(captured.err) if not line.startswith(("usage:", " "))]
    assert code not in (0, None), f"{script} {argv} exited 0\n{captured.out}\n{captured.err}"
    assert "Traceback" not in captured.err, captured.err
    assert len(said) == 1 and said[0].startswith(script) and names in said[0], captured.err
    assert _files(tmp_path) == before, sorted(_files(tmp_path) - before)  # nothing written, valid-looking or not
