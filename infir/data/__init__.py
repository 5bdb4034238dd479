"""infir.data: tokenization to megatron indexed datasets, weighted mixtures with phases, SFT chat
formatting with loss masks and packing, and the bundled demo data.

Public entry points (the training loop and the eval helpers build against these):
  DEMO_TOKENIZER                      path to the bundled 8192-token byte-level BPE (HF directory)
  build_pretrain_datasets(...)        megatron GPTDataset / BlendedDataset train + valid
  build_sft_dataset(prefix, S)        packed SFT dataset (tokens, labels, loss_mask, position_ids, segment_ids)
  infir.data.demo                     arithmetic_problems, ensure_demo_data
"""
from pathlib import Path

DEMO_TOKENIZER: Path = Path(__file__).parent / "demo_tokenizer"
