"""Pretraining data: what `infir-prep pretrain` writes, megatron-core's own readers load."""
import gzip
import json

import numpy as np
import pytest
import torch
from cli_messages import messages

from infir.data import DEMO_TOKENIZER
from infir.data.cli import main as prep_main
from infir.data.pretrain import build_pretrain_datasets
from infir.data.shakespeare import shakespeare_documents
from infir.data.tokenize_corpus import ShardFailed, megatron_indexed, tokenize_to_indexed
from infir.data.tokenizer import load_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore:Transformer Engine and Apex")


@pytest.fixture(scope="module")
def docs():
    return [d["text"] for d in list(shakespeare_documents())[:60]]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(DEMO_TOKENIZER)


def _write_jsonl(path, texts, key="text"):
    with open(path, "w") as f:
        for t in texts:
            f.write(json.dumps({key: t}) + "\n")
    return path


def _read_all(prefix):
    ds = megatron_indexed().IndexedDataset(str(prefix))
    out = [ds[i].tolist() for i in range(len(ds))]
    assert ds.document_indices.tolist() == list(range(len(ds) + 1))  # one sequence per document
    del ds
    return out


def test_megatron_helpers_are_prebuilt():
    from megatron.core.datasets import helpers_cpp  # noqa: F401  (no compiler needed at run time)


def test_all_input_formats_in_order_with_eod(tmp_path, docs, tok):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    a = _write_jsonl(tmp_path / "a.jsonl", docs[:15])
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        for t in docs[15:30]:
            f.write(json.dumps({"body": t}) + "\n")
    pq.write_table(pa.table({"body": docs[30:45]}), tmp_path / "c.parquet")
    datasets.Dataset.from_dict({"body": docs[45:]}).save_to_disk(str(tmp_path / "d_hf"))
    _write_jsonl(tmp_path / "a_body.jsonl", docs[:15], key="body")

    inputs = [tmp_path / "a_body.jsonl", tmp_path / "b.jsonl.gz", tmp_path / "c.parquet", tmp_path / "d_hf"]
    stats = tokenize_to_indexed(inputs, tmp_path / "out" / "all", DEMO_TOKENIZER, text_key="body",
                                workers=2, shard_bytes=20_000, progress=False)
    expected = [ids + [tok.eod] for ids in tok.encode_batch(docs)]
    assert _read_all(tmp_path / "out" / "all") == expected
    assert stats["documents"] == len(docs) and stats["tokens"] == sum(map(len, expected))
    assert stats["skipped"] == {} and stats["dtype"] == "uint16"
    assert not (tmp_path / "out" / "all.shards").exists()
    assert a.exists()


def test_workers_and_shards_do_not_change_the_bytes(tmp_path, docs):
    src = _write_jsonl(tmp_path / "a.jsonl", docs)
    tokenize_to_indexed([src], tmp_path / "one", DEMO_TOKENIZER, workers=1, shard_bytes=1 << 30, progress=False)
    tokenize_to_indexed([src], tmp_path / "many", DEMO_TOKENIZER, workers=2, shard_bytes=7_000, progress=False)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"one{ext}").read_bytes() == (tmp_path / f"many{ext}").read_bytes()


def test_bad_lines_are_counted_with_file_and_line(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_bytes(
        b'{"text": "good one"}\n'          # 1
        b'{"text": broken\n'               # 2 malformed json
        b'{"title": "no text"}\n'          # 3 missing field
        b'{"text": "   "}\n'               # 4 empty document
        b'{"text": "caf\xe9"}\n'           # 5 not UTF-8 (latin-1 byte)
        b'\n'                              # 6 blank line: layout, not counted
        b'{"text": 42}\n'                  # 7 not a string
        b'["a list"]\n'                    # 8 not an object
        b'{"text": "\\ud800 lone"}\n'      # 9 lone surrogate
        b'{"text": "good two"}\n')         # 10
    stats = tokenize_to_indexed([src], tmp_path / "o", DEMO_TOKENIZER, progress=False)
    assert stats["documents"] == 2
    assert stats["skipped"] == {"malformed json": 1, "missing field 'text'": 1, "empty document": 1,
                                "invalid UTF-8": 1, "field 'text' is int, not a string": 1,
                                "json value is a list, not an object": 1, "text holds a lone UTF-16 surrogate": 1}
    logged = [json.loads(line) for line in open(tmp_path / "o.skipped.jsonl")]
    assert [e["line"] for e in logged] == [2, 3, 4, 5, 7, 8, 9]
    assert all(e["file"] == str(src) for e in logged)
    assert [len(x) for x in _read_all(tmp_path / "o")] == [len(load_tokenizer(DEMO_TOKENIZER).encode(t)) + 1
                                                          for t in ("good one", "good two")]


def test_a_failed_shard_keeps_the_finished_ones_and_a_rerun_resumes(tmp_path, docs, monkeypatch):
    import infir.data.tokenize_corpus as tc

    src = _write_jsonl(tmp_path / "a.jsonl", docs)
    real = tc.tokenize_shard
    calls = []

    def flaky(shard, out_prefix, tok, text_key):
        calls.append(out_prefix)
        if out_prefix.endswith("-00002"):
            raise OSError("disk hiccup")
        return real(shard, out_prefix, tok, text_key)

    monkeypatch.setattr(tc, "tokenize_shard", flaky)
    with pytest.raises(ShardFailed, match="disk hiccup") as err:
        tokenize_to_indexed([src], tmp_path / "o", DEMO_TOKENIZER, workers=1, shard_bytes=40_000, progress=False)
    n_shards = len(calls)
    assert n_shards >= 4 and "rerun of the same command resumes" in str(err.value)
    assert "\n" not in str(err.value) and "Traceback" in (tmp_path / "o.shards" / "errors.log").read_text()
    assert len(list((tmp_path / "o.shards").glob("*.stats.json"))) == n_shards - 1

    calls.clear()
    monkeypatch.setattr(tc, "tokenize_shard", lambda *a: (calls.append(a[1]), real(*a))[1])
    tokenize_to_indexed([src], tmp_path / "o", DEMO_TOKENIZER, workers=1, shard_bytes=40_000, progress=False)
    assert [c.rsplit("/", 1)[1] for c in calls] == ["0000-00002"]  # only the failed shard reran
    tokenize_to_indexed([src], tmp_path / "clean", DEMO_TOKENIZER, workers=1, shard_bytes=40_000, progress=False)
    assert (tmp_path / "o.bin").read_bytes() == (tmp_path / "clean.bin").read_bytes()


def test_shards_of_another_tokenizer_are_refused(tmp_path, docs):
    src = _write_jsonl(tmp_path / "a.jsonl", docs[:5])
    (tmp_path / "o.shards").mkdir()
    (tmp_path / "o.shards" / "fingerprint.json").write_text('{"tokenizer": "something else"}')
    with pytest.raises(RuntimeError, match="another tokenizer"):
        tokenize_to_indexed([src], tmp_path / "o", DEMO_TOKENIZER, progress=False)


def test_the_configs_flat_blend_is_read_as_weights_and_prefixes():
    from infir.data.checks import blend_parts
    from infir.data.pretrain import normalize_blend

    assert blend_parts([0.3, "a", 0.7, "b"]) == (["a", "b"], [0.3, 0.7])
    with pytest.raises(FileNotFoundError, match=r"no indexed dataset at prefix a \(a.bin and a.idx are missing\)"):
        normalize_blend([0.3, "a", 0.7, "b"])
    with pytest.raises(TypeError, match="cannot read blend"):
        blend_parts([0.3, "a", 0.7])


def test_gpt_dataset_reads_what_we_wrote(tmp_path, docs, tok):
    src = _write_jsonl(tmp_path / "a.jsonl", docs)
    tokenize_to_indexed([src], tmp_path / "sh", DEMO_TOKENIZER, progress=False)
    S = 64
    train, valid = build_pretrain_datasets(str(tmp_path / "sh"), S, tok, split="90,10,0",
                                           cache_dir=tmp_path / "cache")
    assert len(train) > 100 and len(valid) > 5
    docs_ids = [ids + [tok.eod] for ids in tok.encode_batch(docs)]
    stream = np.concatenate([docs_ids[i] for i in train.document_index]).tolist()
    rng = np.random.default_rng()
    for i in rng.choice(len(train), 25, replace=False):
        item = train[int(i)]
        assert item["tokens"].dtype == item["labels"].dtype == item["position_ids"].dtype == torch.int64
        assert item["loss_mask"].dtype.is_floating_point and item["loss_mask"].shape == (S,)
        assert (item["labels"][:-1] == item["tokens"][1:]).all()
        assert item["position_ids"].tolist() == list(range(S))
        window = item["tokens"].tolist() + item["labels"][-1:].tolist()
        starts = [k for k in range(len(stream) - S) if stream[k] == window[0] and stream[k:k + S + 1] == window]
        assert starts, "a sample is not a window of the document stream"


def test_cli_pretrain_and_its_errors(tmp_path, docs, capsys):
    src = _write_jsonl(tmp_path / "a.jsonl", docs[:5])
    assert prep_main(["pretrain", "--input", str(src), "--output", str(tmp_path / "o"),
                      "--tokenizer", str(DEMO_TOKENIZER), "--workers", "1"]) == 0
    assert "documents=5" in capsys.readouterr().out
    assert prep_main(["pretrain", "--input", str(src), "--output", str(tmp_path / "p"),
                      "--tokenizer", str(tmp_path / "missing")]) == 2
    assert "no tokenizer at" in capsys.readouterr().err
    assert prep_main(["pretrain", "--input", str(tmp_path / "nope.jsonl"), "--output", str(tmp_path / "q"),
                      "--tokenizer", str(DEMO_TOKENIZER)]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "x.csv").write_text("a,b\n")
    assert prep_main(["pretrain", "--input", str(tmp_path / "x.csv"), "--output", str(tmp_path / "r"),
                      "--tokenizer", str(DEMO_TOKENIZER)]) == 2
    assert "unsupported input format" in capsys.readouterr().err


def test_parquet_row_group_shards_keep_order_and_row_numbers(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from infir.data.sources import iter_texts, plan_shards

    texts = [f"document {i}" if i % 97 else None for i in range(1000)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "p.parquet", row_group_size=128)
    shards = plan_shards(tmp_path / "p.parquet", target_bytes=1 << 20, target_rows=300)
    assert len(shards) == 3 and sum(s.size for s in shards) == 1000
    records = [r for s in shards for r in iter_texts(s, "text")]
    assert [r.line for r in records] == list(range(1, 1001))
    assert [r.value for r in records if r.skip is None] == [t for t in texts if t is not None]
    assert {r.line for r in records if r.skip} == {i + 1 for i, t in enumerate(texts) if t is None}


def _written(tmp_path, inputs):
    return sorted(p.name for p in tmp_path.rglob("*") if p not in inputs)


@pytest.mark.parametrize("content, message", [
    (b"", "no document in {src}: the input is empty; nothing written"),
    (b"\n\n  \n", "no document in {src}: the input is empty"),
    (b'{"text": broken\n{"title": "x"}\n', "no usable document in {src}: all 2 lines skipped "
                                            "(malformed json: 1, missing field 'text': 1; first: {src}:1: malformed json"),
], ids=["empty", "blank lines", "bad lines"])
@pytest.mark.parametrize("workers", [1, 2])
def test_inputs_without_a_document_fail_naming_them_and_write_nothing(tmp_path, capsys, content, message, workers):
    src = tmp_path / "in.jsonl"
    src.write_bytes(content)
    assert prep_main(["pretrain", "--input", str(src), "--output", str(tmp_path / "out" / "o"),
                      "--tokenizer", str(DEMO_TOKENIZER), "--workers", str(workers)]) == 2
    err = messages(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith(f"infir-prep pretrain: error: {message.format(src=src)}"), err
    assert _written(tmp_path, [src]) == ["out"]  # the output folder, empty


def _truncated_gzip(path):
    data = gzip.compress(b"".join(json.dumps({"text": f"line {i}"}).encode() + b"\n" for i in range(3000)))
    path.write_bytes(data[:len(data) // 2])


@pytest.mark.parametrize("name, write, message", [
    ("in.jsonl.gz", _truncated_gzip, "not a readable gzip file (Compressed file ended"),
    ("in.jsonl.gz", lambda p: p.write_bytes(b"not gzip at all"), "not a readable gzip file"),
    ("in.parquet", lambda p: p.write_bytes(b"PAR1 and then garbage"), "not a readable parquet file"),
], ids=["truncated gzip", "not gzip", "corrupt parquet"])
def test_a_truncated_or_corrupt_input_file_is_named_and_nothing_is_written(tmp_path, capsys, name, write, message):
    good = _write_jsonl(tmp_path / "good.jsonl", ["a fine document"] * 50)
    src = tmp_path / name
    write(src)
    assert prep_main(["pretrain", "--input", str(good), str(src), "--output", str(tmp_path / "o"),
                      "--tokenizer", str(DEMO_TOKENIZER), "--workers", "2"]) == 2
    err = messages(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith(f"infir-prep pretrain: error: {src}: {message}"), err
    assert _written(tmp_path, [good, src]) == []
