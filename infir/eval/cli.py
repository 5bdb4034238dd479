"""`infir-eval`: run an evaluation, compare runs, list benchmarks.

  infir-eval run model=PATH benchmarks=[aime24,gpqa_diamond] [preset=demo] [key=value ...]
  infir-eval compare RUN_A RUN_B ... [--metric pass@1] [--out table.md]
  infir-eval list
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

USAGE = __doc__


def _run(overrides: list[str]) -> int:
    from omegaconf import OmegaConf

    from infir.eval.config import load_config
    from infir.eval.report import summary_markdown
    from infir.eval.runner import evaluate

    cfg = load_config(overrides)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("infir.eval").info("config:\n%s", OmegaConf.to_yaml(cfg))
    print(summary_markdown(evaluate(cfg)))
    return 0


def _compare(argv: list[str]) -> int:
    from infir.eval.report import compare_markdown, load_summary

    parser = argparse.ArgumentParser(prog="infir-eval compare", description="put runs side by side")
    parser.add_argument("runs", nargs="+", help="run directories (or their summary.json); the first is the baseline")
    parser.add_argument("--metric", default="avg", help="avg (avg@n, default) or pass@K")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    table = compare_markdown([load_summary(r) for r in args.runs], metric=args.metric)
    print(table, end="")
    if args.out:
        args.out.write_text(table)
    return 0


def _list() -> int:
    from infir.eval.benchmarks import registry

    for name, b in registry().items():
        s = b.sampling
        print(f"{name:18s} {b.grader:6s} {b.hf_id}  (n={s.n}, T={s.temperature}, top_p={s.top_p}, max_new_tokens={s.max_new_tokens})")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "run":
        return _run(rest)
    if command == "compare":
        return _compare(rest)
    if command == "list":
        return _list()
    print(f"infir-eval: unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
