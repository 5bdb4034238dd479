"""The bundled demo tokenizer: the contract others build against, and its deterministic rebuild."""
import json

from tokenizers import Tokenizer

from infir.data import DEMO_TOKENIZER
from infir.data.bpe import CHATML_TEMPLATE
from infir.data.demo import build_demo_tokenizer


def test_loads_with_transformers_and_tokenizers():
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(DEMO_TOKENIZER)
    raw = Tokenizer.from_file(str(DEMO_TOKENIZER / "tokenizer.json"))
    assert len(hf) == raw.get_vocab_size() == 8192
    assert [raw.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    text = "O Romeo, Romeo! wherefore art thou Romeo? 12 + 7 = 19."
    assert hf(text)["input_ids"] == raw.encode(text).ids
    assert hf.decode(hf(text)["input_ids"]) == text
    # Digits are single tokens (Qwen's pre-tokenizer): what arithmetic needs.
    assert [hf.decode([i]) for i in hf("1234")["input_ids"]] == ["1", "2", "3", "4"]


def test_chat_template_is_chatml():
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(DEMO_TOKENIZER)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert json.loads((DEMO_TOKENIZER / "tokenizer_config.json").read_text())["chat_template"] == CHATML_TEMPLATE


def test_rebuild_is_byte_identical(tmp_path):
    build_demo_tokenizer(tmp_path)
    assert (tmp_path / "tokenizer.json").read_bytes() == (DEMO_TOKENIZER / "tokenizer.json").read_bytes()
    assert (tmp_path / "tokenizer_config.json").read_bytes() == (DEMO_TOKENIZER / "tokenizer_config.json").read_bytes()
