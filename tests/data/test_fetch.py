"""`infir-prep fetch` against a local "hub" (tests/data/fake_hub.py: the real datasets' layouts and
columns): the spec's sources, budgets met within 1%, `infir-prep pretrain` / `sft` reading what it
wrote with the same counts, the mixture rebuilt from the counts, and a fetch killed mid-way (at any
row, or between a shard's rename and its progress file) resuming without losing or repeating a document."""
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from cli_messages import messages
from fake_hub import build_fake_hub, swh_blobs

import infir.data.fetch as fetch_module
from infir.data.cli import main
from infir.data.fetch import fetch
from infir.data.fetch_spec import ChatFields, load_fetch_spec
from infir.data.mixture import MixtureError, load_spec
from infir.data.sft import prepare_sft
from infir.data.tokenize_corpus import tokenize_to_indexed

ROOT = Path(__file__).resolve().parents[2]
CPT_SPEC = ROOT / "data_prep" / "mixtures" / "infir2_cpt.yaml"
SFT_SPEC = ROOT / "data_prep" / "mixtures" / "infialign_sft.yaml"
# Tokens per source of the budget test: 20k runs in seconds on 2 cores (documents of 50-150 tokens, so
# 1% is more than half a document); INFIR_FETCH_TEST_BUDGET=1e6 runs the same test at the 1M of the target.
BUDGET = int(float(os.environ.get("INFIR_FETCH_TEST_BUDGET", 20_000)))


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    return build_fake_hub(tmp_path_factory.mktemp("hub"), rows=max(400, BUDGET // 40))


@pytest.fixture(autouse=True)
def software_heritage(monkeypatch, hub):
    """Stack-Edu's files from the fake hub's blob table, as the S3 bucket would return them."""
    blobs = swh_blobs(hub)
    monkeypatch.setattr(fetch_module, "software_heritage_text", lambda blob, encoding: blobs.get(blob))


@pytest.fixture(autouse=True)
def tokenizers_loaded_once(monkeypatch):
    """Each fetch loads its tokenizer and chat template; here they are loaded once per directory, so the
    many fetches of these tests take seconds (the loaded objects are the ones a fetch makes)."""
    import infir.data.sft
    import infir.data.tokenize_corpus

    for module, name in ((fetch_module, "load_tokenizer"), (fetch_module, "ChatFormatter"),
                         (infir.data.tokenize_corpus, "load_tokenizer"), (infir.data.sft, "ChatFormatter")):
        monkeypatch.setattr(module, name, _once(getattr(module, name)))


@pytest.fixture(autouse=True)
def no_pause_after_interleaving(monkeypatch):
    """datasets pauses 5 s each time an interleaved stream (a source of several configs) ends, for a
    pyarrow thread-shutdown issue with remote files; these are local files, read many times."""
    import datasets

    monkeypatch.setattr(datasets.config, "SLEEP_TIME_ON_THREADS_SHUTDOWN", 0)


@functools.cache
def _once(make):
    return functools.cache(lambda path: make(path))


def documents(root: Path, source: str) -> list:
    """Every document written for ``source``, in order."""
    column = []
    for path in sorted((root / "raw" / source).glob("part-*.parquet")):
        table = pq.read_table(path)
        column += table.column(table.schema.names[0]).to_pylist()
    return column


def test_cpt_sources_meet_their_budgets_and_pretrain_reads_the_same_tokens(tmp_path, hub, qwen_tokenizer_dir):
    report = fetch(CPT_SPEC, tmp_path, qwen_tokenizer_dir, from_dir=hub, tokens_per_source=BUDGET,
                   shard_tokens=BUDGET // 3, progress=False)
    states = report["states"]
    assert set(states) == set(load_fetch_spec(CPT_SPEC).sources)
    for name, state in states.items():
        if name == "kaggle_notebooks":  # smaller than the budget: read to its end, both configs
            assert state["finished"] == "exhausted" and state["tokens"] < BUDGET
            texts = documents(tmp_path, name)
            assert any(t.startswith("<jupyter_code>") for t in texts) and any(t.startswith("<issue_start>") for t in texts)
        else:
            assert state["finished"] == "budget" and abs(state["tokens"] / BUDGET - 1) <= 0.01, name
        stats = tokenize_to_indexed(sorted((tmp_path / "raw" / name).glob("part-*.parquet")), tmp_path / "cpt" / name,
                                    qwen_tokenizer_dir, progress=False)
        assert (stats["tokens"], stats["documents"], stats["skipped"]) == (state["tokens"], state["documents"], {})
    assert states["fineweb"]["skipped"] == {"empty document": 2} and states["fineweb"]["shards"] >= 3
    assert states["stack_edu"]["skipped"] == {"blob not in Software Heritage": 1}
    assert states["am_qwen3"]["skipped"] == {"a turn without a known 'from'": 1}
    reasoning = documents(tmp_path, "am_deepseek_r1")[0]  # a conversation, rendered with the chat template
    assert reasoning.startswith("<|im_start|>user\n") and "<|im_start|>assistant\n<think>" in reasoning

    manifest = json.loads(report["manifest"].read_text())["sources"]
    assert manifest["fineweb"]["hub"] == "HuggingFaceFW/fineweb" and manifest["fineweb"]["license"].startswith("odc-by")
    phases = load_spec(report["mixture"])  # what `infir-prep mixture` resolves: each source read once in all
    for name, state in states.items():
        read = sum(s.budget for p in phases for s in p.sources if s.name == name)
        assert abs(read - state["tokens"]) <= 2 and all(s.epochs <= 1.0001 for p in phases for s in p.sources)
    general = {s.name: s.budget for s in phases[0].sources}
    assert general["fineweb"] == pytest.approx(states["fineweb"]["tokens"] * 77 / 82.5, abs=1)


def test_sft_sets_are_written_as_chat_rows_that_infir_prep_sft_reads(tmp_path, hub, qwen_tokenizer_dir):
    report = fetch(SFT_SPEC, tmp_path, qwen_tokenizer_dir, from_dir=hub, progress=False)
    for name, state in report["states"].items():
        assert state["finished"] == "exhausted" and state["skipped"] == {}  # no budget: the whole set
        rows = documents(tmp_path, name)
        assert rows[0][0]["role"] == "user" and rows[0][1]["content"].startswith("<think>")
        stats = prepare_sft(sorted((tmp_path / "raw" / name).glob("part-*.parquet")), tmp_path / "sft" / name,
                            qwen_tokenizer_dir, seq_length=4096, progress=False)
        assert (stats["samples"], stats["tokens"]) == (state["documents"], state["tokens"])
    assert report["mixture"] is None


class Killed(BaseException):
    """Stands for SIGKILL: not an Exception, so nothing on the way up handles it."""


@pytest.mark.parametrize("source", ["fineweb", "kaggle_notebooks", "am_qwen3"])
@pytest.mark.parametrize("kill", ["mid-shard", "after-rename"])
def test_a_killed_fetch_resumes_without_losing_or_repeating_a_document(tmp_path, hub, qwen_tokenizer_dir, monkeypatch,
                                                                       source, kill):
    run = dict(from_dir=hub, only=[source], tokens_per_source=10_000, shard_tokens=1_500, progress=False)
    fetch(CPT_SPEC, tmp_path / "whole", qwen_tokenizer_dir, **run)
    expected = documents(tmp_path / "whole", source)
    folder = tmp_path / "killed" / "raw" / source
    with monkeypatch.context() as patch:
        # Small batches and row groups: the kill finds shards on disk, finished and half-written.
        patch.setattr(fetch_module, "BATCH_ROWS", 8)
        patch.setattr(fetch_module, "ROW_GROUP_ROWS", 4)
        if kill == "mid-shard":  # dies converting a batch once a shard is done and the next one half-written
            convert = fetch_module.Documents.convert

            def dying(self, rows):
                if (folder / "progress.json").is_file() and list(folder.glob("*.partial")):
                    raise Killed
                return convert(self, rows)
            patch.setattr(fetch_module.Documents, "convert", dying)
        else:  # dies after the second shard is renamed into place, before its progress.json is written
            save, calls = fetch_module._atomic_write_json, []

            def dying(path, obj):
                calls.append(1)
                if len(calls) == 2:
                    raise Killed
                save(path, obj)
            patch.setattr(fetch_module, "_atomic_write_json", dying)
        with pytest.raises(Killed):
            fetch(CPT_SPEC, tmp_path / "killed", qwen_tokenizer_dir, **run)
    left = sorted(p.name for p in folder.glob("part-*"))
    assert left[-1].endswith(".partial" if kill == "mid-shard" else ".parquet")
    assert json.loads((folder / "progress.json").read_text())["shards"] == len(left) - 1  # one not counted
    resumed = fetch(CPT_SPEC, tmp_path / "killed", qwen_tokenizer_dir, **run)  # default batch sizes again

    assert documents(tmp_path / "killed", source) == expected
    whole = json.loads((tmp_path / "whole" / "raw" / source / "progress.json").read_text())
    for key in ("rows", "documents", "tokens", "skipped", "finished"):  # shards: they end where each run paused
        assert resumed["states"][source][key] == whole[key], key


def test_a_stream_that_breaks_off_exits_1_and_the_same_command_resumes(tmp_path, hub, qwen_tokenizer_dir, monkeypatch,
                                                                          capsys):
    argv = ["fetch", "--spec", str(CPT_SPEC), "--root", str(tmp_path / "cut"), "--tokenizer", str(qwen_tokenizer_dir),
            "--from-dir", str(hub), "--sources", "nemotron", "--tokens-per-source", "8000", "--shard-tokens", "2000"]
    fetch(CPT_SPEC, tmp_path / "whole", qwen_tokenizer_dir, from_dir=hub, only=["nemotron"], tokens_per_source=8_000,
          shard_tokens=2_000, progress=False)
    with monkeypatch.context() as patch:
        patch.setattr(fetch_module, "BATCH_ROWS", 8)
        convert, calls = fetch_module.Documents.convert, []

        def cut(self, rows):
            calls.append(1)
            if len(calls) == 6:  # after a shard or two
                raise ConnectionError("Connection reset by peer")
            return convert(self, rows)
        patch.setattr(fetch_module.Documents, "convert", cut)
        assert main(argv) == 1
    (line,) = messages(capsys.readouterr().err)
    assert "nemotron: the stream from nvidia/Nemotron-CC-v2 broke off" in line and "rerunning the command resumes" in line
    assert main(argv) == 0
    assert documents(tmp_path / "cut", "nemotron") == documents(tmp_path / "whole", "nemotron")


def test_a_larger_budget_later_continues_from_where_the_smaller_one_stopped(tmp_path, hub, qwen_tokenizer_dir):
    run = dict(from_dir=hub, only=["am_deepseek_r1"], shard_tokens=2_000, progress=False)
    fetch(CPT_SPEC, tmp_path / "once", qwen_tokenizer_dir, tokens_per_source=12_000, **run)
    fetch(CPT_SPEC, tmp_path / "twice", qwen_tokenizer_dir, tokens_per_source=5_000, **run)
    again = fetch(CPT_SPEC, tmp_path / "twice", qwen_tokenizer_dir, tokens_per_source=12_000, **run)
    assert documents(tmp_path / "twice", "am_deepseek_r1") == documents(tmp_path / "once", "am_deepseek_r1")
    assert abs(again["states"]["am_deepseek_r1"]["tokens"] / 12_000 - 1) <= 0.01


def test_other_settings_in_the_same_folder_are_refused(tmp_path, hub, qwen_tokenizer_dir):
    from infir.data import DEMO_TOKENIZER
    from infir.data.hub import FetchError

    run = dict(from_dir=hub, only=["nemotron"], tokens_per_source=2_000, progress=False)
    fetch(CPT_SPEC, tmp_path, qwen_tokenizer_dir, **run)
    with pytest.raises(FetchError, match=r"raw/nemotron holds rows fetched with other settings \(tokenizer\); delete"):
        fetch(CPT_SPEC, tmp_path, DEMO_TOKENIZER, **run)


def test_the_cli_fetches_and_prints_the_commands_that_read_the_shards(tmp_path, hub, qwen_tokenizer_dir, capsys):
    assert main(["fetch", "--spec", str(CPT_SPEC), "--root", str(tmp_path), "--tokenizer", str(qwen_tokenizer_dir),
                 "--from-dir", str(hub), "--sources", "fineweb", "nemotron", "--tokens-per-source", "3e3"]) == 0
    out = capsys.readouterr().out
    assert f"infir-prep pretrain --input {tmp_path}/raw/fineweb/part-*.parquet --output {tmp_path}/cpt/fineweb" in out
    assert f"infir-prep mixture --spec {tmp_path}/infir2_cpt.fetched.yaml" in out
    assert "fineweb: " in out and "budget met" in out
    phases = yaml.safe_load((tmp_path / "infir2_cpt.fetched.yaml").read_text())["phases"]
    assert [s["name"] for s in phases[0]["sources"]] == ["fineweb", "nemotron"]  # only what was fetched


def test_without_network_one_line_names_from_dir(tmp_path, qwen_tokenizer_dir):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "infir.data.cli", "fetch", "--spec", str(CPT_SPEC), "--root",
                           str(tmp_path / "out"), "--tokenizer", str(qwen_tokenizer_dir)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2
    (line,) = messages(proc.stderr)
    assert "cannot reach the Hugging Face hub for HuggingFaceFW/fineweb" in line and "--from-dir DIR" in line
    assert not (tmp_path / "out" / "raw").exists()


def test_a_missing_local_copy_says_how_to_make_it(tmp_path, qwen_tokenizer_dir):
    with pytest.raises(FileNotFoundError, match=r"hf download nvidia/Nemotron-CC-v2 --repo-type dataset --local-dir"):
        fetch(CPT_SPEC, tmp_path, qwen_tokenizer_dir, from_dir=tmp_path / "empty", only=["nemotron"], progress=False)


@pytest.mark.parametrize("spec,error", [
    ({"sources": {"a": {"text": "text"}}}, r"sources.a needs 'hub'"),
    ({"sources": {"a": {"hub": "o/a"}}}, r"sources.a needs exactly one of 'text'"),
    ({"write": "messages", "sources": {"a": {"hub": "o/a", "text": "t"}}}, r"needs 'messages' fields"),
    ({"sources": {"a": {"hub": "o/a", "text": "t", "confg": "x"}}}, r"unknown keys \['confg'\]"),
    ({"sources": {"a": {"hub": "o/a", "text": "t"}}, "phases": [{"sources": [{"name": "b", "prefix": "b", "weight": 1}],
                                                                "tokens": 10}]}, r"reads 'b', which 'sources' does not declare"),
    ({"sources": {"a": {"hub": "o/a", "text": "t"}, "b": {"hub": "o/b", "text": "t"}},
      "phases": [{"sources": [{"name": "a", "prefix": "a", "tokens": 5}]}]}, r"no phase reads sources.b"),
])
def test_a_bad_spec_names_the_key(tmp_path, spec, error):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(MixtureError, match=error):
        load_fetch_spec(path)


def test_sharegpt_and_openai_layouts_map_to_chatml_roles():
    row = {"system": "Be brief.", "conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]}
    assert ChatFields("conversations", "from", "value", system="system").messages(row) == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}]
    assert ChatFields().messages({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})[1] \
        == {"role": "assistant", "content": "b"}
