"""One huge document costs memory in proportion to a piece of it, not to its length, and encodes to
the same ids as if it were encoded whole."""
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from infir.data import DEMO_TOKENIZER
from infir.data.sft import prepare_sft
from infir.data.tokenize_corpus import megatron_indexed, tokenize_to_indexed
from infir.data.tokenizer import load_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore:Transformer Engine and Apex")

DOC_CHARS = 2_000_000
# Encoded whole, a 2 MB document took ~440 MB more than the process's size after imports (HF keeps
# offsets and token strings per token, Python an int object per id); in pieces it takes ~40 MB.
MAX_GROWTH_MB = 150

_WORDS = ["alpha", "beta", "gamma", "the", "of", "and", "café", "(foo)", "12345", "x_1", "naïve", "\n"]


def _long_text(chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    words = []
    for _ in range(chars // 5):
        words.append(rng.choice(_WORDS))
    return " ".join(words)[:chars]


_MEASURE = """
import resource, sys
from infir.data import DEMO_TOKENIZER
from infir.data.chat import ChatFormatter
from infir.data.sft import prepare_sft
from infir.data.tokenize_corpus import megatron_indexed, tokenize_to_indexed

ChatFormatter(DEMO_TOKENIZER)
megatron_indexed()
import multiprocessing.pool, tqdm  # noqa: E401  (what the run imports, loaded before the baseline)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
src, out, command = sys.argv[1:]
if command == "pretrain":
    tokenize_to_indexed([src], out, DEMO_TOKENIZER, workers=1, progress=False)
else:
    prepare_sft(src, out, DEMO_TOKENIZER, seq_length=256, overlong="truncate", progress=False)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""


@pytest.mark.parametrize("command", ["pretrain", "sft"])
def test_a_long_document_takes_memory_bounded_by_a_piece(tmp_path, command):
    text = _long_text(DOC_CHARS)
    row = {"text": text} if command == "pretrain" else {"prompt": "Repeat after me.", "response": text}
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(row) + "\n")
    proc = subprocess.run([sys.executable, "-c", _MEASURE, str(src), str(tmp_path / "o"), command],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stderr
    growth_mb = float(proc.stdout.split()[-1])
    assert growth_mb < MAX_GROWTH_MB, f"{command}: a {DOC_CHARS / 1e6:.0f} MB document grew the process by {growth_mb:.0f} MB"


def test_a_long_document_has_the_ids_of_the_whole(tmp_path, monkeypatch):
    import infir.data.tokenizer as tokenizer

    monkeypatch.setattr(tokenizer, "PIECE_CHARS", 1000)
    monkeypatch.setattr("infir.data.tokenize_corpus.PIECE_CHARS", 1000)
    docs = ["a short one", _long_text(20_000, seed=1), "another short one", _long_text(5_000, seed=2)]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    stats = tokenize_to_indexed([src], tmp_path / "o", DEMO_TOKENIZER, workers=1, progress=False)
    tok = load_tokenizer(DEMO_TOKENIZER)
    ds = megatron_indexed().IndexedDataset(str(tmp_path / "o"))
    assert stats["documents"] == 4
    for i, doc in enumerate(docs):  # in input order, long ones included
        np.testing.assert_array_equal(ds[i], tok.encode(doc) + [tok.eod])
    del ds


def test_a_document_that_cannot_be_cut_is_skipped_naming_the_limit(tmp_path, monkeypatch):
    import infir.data.tokenizer as tokenizer

    monkeypatch.setattr(tokenizer, "MAX_PIECE_CHARS", 1 << 19)
    monkeypatch.setattr("infir.data.tokenize_corpus.PIECE_CHARS", tokenizer.PIECE_CHARS)
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": "x" * (1 << 20)}) + "\n")
    stats = tokenize_to_indexed([src], tmp_path / "o", DEMO_TOKENIZER, workers=1, progress=False)
    assert stats["documents"] == 1
    assert stats["skipped_examples"]["too long to encode"] == [
        f"{src}:2: too long to encode (a stretch of more than {1 << 19:,} characters with no line break or space "
        "between words)"]


def test_an_overlong_sft_sample_is_truncated_to_the_tokens_of_the_whole(tmp_path, monkeypatch):
    import infir.data.tokenizer as tokenizer
    from infir.data.chat import ChatFormatter, to_messages

    row = {"prompt": "Repeat after me.", "response": _long_text(30_000, seed=3)}
    whole_ids, whole_mask = ChatFormatter(DEMO_TOKENIZER).encode(to_messages(row))
    monkeypatch.setattr(tokenizer, "PIECE_CHARS", 500)
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(row) + "\n")
    stats = prepare_sft(src, tmp_path / "o", DEMO_TOKENIZER, seq_length=2000, overlong="truncate", progress=False)
    assert stats["truncated"] == 1
    idx = megatron_indexed()
    tokens, masks = idx.IndexedDataset(str(tmp_path / "o")), idx.IndexedDataset(str(tmp_path / "o.lossmask"))
    assert tokens[0].tolist() == whole_ids[:2001] and masks[0].tolist() == whole_mask[:2001]
    del tokens, masks
