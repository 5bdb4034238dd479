"""`infir-eval`: run an evaluation, compare runs, list benchmarks.

  infir-eval run model=PATH benchmarks=[aime24,gpqa_diamond] [preset=demo] [source=bundle:DIR] [key=value ...]
  infir-eval compare RUN_A RUN_B ... [--metric pass@1] [--out table.md]
  infir-eval bundle DIR [--benchmarks aime24 ...] [--force]   (every benchmark's problems, for offline hosts)
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
    _check_inputs(cfg)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("infir.eval").info("config:\n%s", OmegaConf.to_yaml(cfg))
    print(summary_markdown(evaluate(cfg)))
    return 0


def _check_inputs(cfg) -> None:
    """What can be checked before a model loads: the model path, the benchmark names and the
    checksums of the bundles they are read from."""
    from infir.eval.benchmarks import get_benchmark
    from infir.eval.bundle import bundle_dir, verified_file
    from infir.eval.model_input import check_model

    check_model(cfg.model)
    for name in cfg.benchmarks:
        bench = get_benchmark(name)
        directory = bundle_dir(cfg.sources.get(name, cfg.source))
        if directory is not None and bench.records is None:
            verified_file(directory, name)


BUNDLED = ("aime24", "aime25", "gpqa_diamond", "livecodebench_v5", "math500")


def _bundle(argv: list[str]) -> int:
    from tqdm import tqdm

    from infir.eval.benchmarks import get_benchmark, hub_records
    from infir.eval.bundle import done, write_records

    parser = argparse.ArgumentParser(prog="infir-eval bundle", description="write benchmarks' problems for offline use")
    parser.add_argument("dir", type=Path, help="the bundle's folder (run with source=bundle:DIR)")
    parser.add_argument("--benchmarks", nargs="+", default=list(BUNDLED), help=f"default: {' '.join(BUNDLED)}")
    parser.add_argument("--force", action="store_true", help="fetch again the benchmarks the bundle already holds")
    args = parser.parse_args(argv)
    benches = [get_benchmark(name) for name in args.benchmarks]  # unknown names fail before any download
    for bench in benches:
        if not args.force and done(args.dir, bench.name):
            print(f"{bench.name}: already in {args.dir}")
            continue
        records = bench.records() if bench.records is not None else hub_records(bench)
        records = tqdm((r for r in records if bench.keep(r)), desc=bench.name, unit=" records", file=sys.stderr)
        origin = {"hf_id": bench.hf_id, "config": bench.hf_config, "split": bench.split,
                  "data_files": list(bench.hf_data_files)}
        entry = write_records(args.dir, bench.name, records, origin)
        print(f"{bench.name}: {entry['records']} records -> {args.dir / entry['file']} (sha256 {entry['sha256'][:16]})")
    print(f"run offline with: infir-eval run ... source=bundle:{args.dir}")
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


def _one_line(err: Exception) -> str:
    """An expected error as one line; OmegaConf's errors name their key first."""
    from omegaconf.errors import OmegaConfBaseException

    first = str(err.args[0] if isinstance(err, KeyError) and err.args else err).strip().splitlines()[0]
    if isinstance(err, OmegaConfBaseException) and getattr(err, "full_key", None):
        return f"{err.full_key}: {first}"
    return first


def main(argv: list[str] | None = None) -> int:
    """Expected failures (a missing or unreadable model, summary, preset or bundle, a bad key or value,
    a hub that does not answer) end with one line naming the problem and exit code 2."""
    from omegaconf.errors import OmegaConfBaseException

    from infir.eval.benchmarks import HubError

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    commands = {"run": lambda: _run(rest), "compare": lambda: _compare(rest), "bundle": lambda: _bundle(rest),
                "list": _list}
    if command not in commands:
        print(f"infir-eval: unknown command {command!r}\n{USAGE}", file=sys.stderr)
        return 2
    try:
        return commands[command]()
    except (FileNotFoundError, ValueError, KeyError, HubError, OmegaConfBaseException) as err:
        print(f"infir-eval {command}: error: {_one_line(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
