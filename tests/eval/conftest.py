"""Fixtures of the eval tests: a tiny random HF Qwen2 with the demo tokenizer (built once per session)."""

import pytest
import torch


def build_tiny_qwen2(out_dir, tokenizer_dir):
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
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
