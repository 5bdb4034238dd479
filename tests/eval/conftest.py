"""Fixtures of the eval tests: a tiny random HF Qwen2 with the demo tokenizer (built once per session),
and a fake hub serving the benchmarks' shipped sample rows."""
import json

import pytest
import torch


def build_tiny_qwen2(out_dir, tokenizer_dir, **config):
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **config)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def demo_tokenizer_dir():
    from infir.data import DEMO_TOKENIZER

    return DEMO_TOKENIZER


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, demo_tokenizer_dir):
    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny_qwen2"), demo_tokenizer_dir)


@pytest.fixture(scope="session")
def lively_model_dir(tmp_path_factory, demo_tokenizer_dir):
    """The tiny Qwen2 with larger random weights: its greedy answers differ from prompt to prompt (at the
    default initializer range every prompt gets the same repeated token)."""
    return build_tiny_qwen2(tmp_path_factory.mktemp("lively_qwen2"), demo_tokenizer_dir, initializer_range=0.2)


class FakeHub:
    """The hub as the benchmarks read it: `datasets.load_dataset` gives each dataset's shipped sample rows
    (the first config; later ones are empty) and `huggingface_hub.hf_hub_download` gives LiveCodeBench's
    raw files (its sample rows spread over test.jsonl and test3.jsonl). `calls` lists what was asked."""

    def __init__(self, monkeypatch, tmp_path):
        import datasets
        import huggingface_hub

        from infir.eval.benchmarks import registry

        self.calls, self.offline = [], False
        self.rows = {b.hf_id: [json.loads(l) for l in b.sample_file.read_text().splitlines()]
                     for b in registry().values() if b.sample_file is not None}
        self.first_config = {b.hf_id: (b.hf_config[0] if isinstance(b.hf_config, tuple) else b.hf_config)
                             for b in registry().values()}
        self.files = tmp_path / "hub_files"
        self.files.mkdir()
        lcb = self.rows["livecodebench/code_generation_lite"]
        for name, rows in (("test.jsonl", lcb[:2]), ("test2.jsonl", []), ("test3.jsonl", lcb[2:]),
                           ("test4.jsonl", []), ("test5.jsonl", [])):
            (self.files / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        monkeypatch.setattr(datasets, "load_dataset", self.load_dataset)
        monkeypatch.setattr(huggingface_hub, "hf_hub_download", self.hf_hub_download)

    def load_dataset(self, path, config=None, split=None, **kwargs):
        self.calls.append(("load_dataset", path, config, split))
        if self.offline:
            raise ConnectionError("Couldn't reach the Hub (no network)")
        return self.rows[path] if config == self.first_config[path] else []

    def hf_hub_download(self, repo_id, filename, repo_type=None, **kwargs):
        self.calls.append(("hf_hub_download", repo_id, filename, repo_type))
        if self.offline:
            raise ConnectionError("Couldn't reach the Hub (no network)")
        return str(self.files / filename)


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    return FakeHub(monkeypatch, tmp_path)
