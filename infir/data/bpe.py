"""Train a Qwen-style byte-level BPE tokenizer with HF ``tokenizers`` and save it as an HF directory.

"Qwen-style" means the pieces that shape what a model sees: NFC normalisation, Qwen2's
pre-tokenisation regex (digits split one by one, which matters for arithmetic), byte-level BPE,
the special tokens ``<|endoftext|>`` (end of document), ``<|im_start|>``, ``<|im_end|>``, and a
ChatML chat template. The demo tokenizer in ``infir/data/demo_tokenizer`` is built by this module.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

EOD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (EOD_TOKEN, IM_START, IM_END)

# Qwen2/2.5's pre-tokenizer pattern (identical to the one qwen.tiktoken is used with).
QWEN_PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ChatML as Qwen2.5 renders it, minus Qwen's default system prompt (a tiny demo model should not
# spend its context on "You are Qwen, created by Alibaba Cloud").
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE with exactly ``vocab_size`` entries (special tokens first: ids 0, 1, 2)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(
            f"train_bpe: the corpus yields only {tok.get_vocab_size()} tokens, {vocab_size} asked; "
            "give it more text or ask for a smaller vocabulary")
    return tok


def save_hf_directory(tok: Tokenizer, out_dir: Path) -> Path:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` (ChatML template) loadable by
    ``transformers.AutoTokenizer`` and ``tokenizers.Tokenizer.from_file``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                  "single_word": False, "special": True}
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        # As in Qwen2.5-Instruct: generation stops at <|im_end|>; documents end with <|endoftext|>.
        "eos_token": IM_END,
        "pad_token": EOD_TOKEN,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 32768,
        "split_special_tokens": False,
        "chat_template": CHATML_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return out_dir
