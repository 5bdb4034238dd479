"""Rebuild the bundled demo tokenizer (`infir/data/demo_tokenizer/`) from the demo corpus.

    python data_prep/build_demo_tokenizer.py [--out DIR]

Deterministic: the corpus order is fixed (sorted play files, seeded problems) and the HF BPE
trainer breaks ties by pair order, so a rebuild gives a byte-identical tokenizer.json
(tests/data/test_demo_tokenizer.py holds that).
"""
import argparse
from pathlib import Path

from infir.data import DEMO_TOKENIZER
from infir.data.demo import build_demo_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEMO_TOKENIZER)
    out = build_demo_tokenizer(parser.parse_args().out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
