"""infir.data: tokenization to megatron indexed datasets, weighted mixtures with phases, SFT chat
formatting with loss masks and packing, and the bundled demo data.

Public entry points (the training loop and the eval helpers build against these):
  DEMO_TOKENIZER                         path to the bundled 8192-token byte-level BPE (HF directory)
  resolve_tokenizer("demo" | DIR)        a config's tokenizer entry -> a directory
  build_pretrain_datasets(blend, S, tok) megatron GPTDataset / BlendedDataset (train, valid)
  infir.data.pretrain.build_phase_datasets  the same for one phase of a mixture
  build_sft_dataset(prefix, S)           packed SFT rows (tokens, labels, loss_mask, position_ids restarting per sample)
  infir.data.mixture                     load_resolved, phase_schedule
  infir.data.demo                        arithmetic_problems, EVAL_SEED, ensure_demo_data

The heavy names are imported on first use, so ``from infir.data import DEMO_TOKENIZER`` stays
cheap (no torch, megatron or transformers import).
"""
from pathlib import Path

DEMO_TOKENIZER: Path = Path(__file__).parent / "demo_tokenizer"

_LAZY = {
    "build_pretrain_datasets": "infir.data.pretrain",
    "build_sft_dataset": "infir.data.sft",
    "load_tokenizer": "infir.data.tokenizer",
}


def resolve_tokenizer(name_or_dir: str | Path) -> Path:
    """``"demo"`` -> DEMO_TOKENIZER; anything else is taken as an HF tokenizer directory."""
    return DEMO_TOKENIZER if str(name_or_dir) == "demo" else Path(name_or_dir)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'infir.data' has no attribute {name!r}")
