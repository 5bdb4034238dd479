"""``infir-prep``: turn raw data into what training reads.

    infir-prep pretrain --input PATH [PATH ...] --output PREFIX --tokenizer DIR [--text-key text] [--workers N]
    infir-prep sft      --input PATH [PATH ...] --output PREFIX --tokenizer DIR --seq-length N [--overlong drop|truncate]
    infir-prep fetch    --spec YAML [YAML ...] --root DIR --tokenizer DIR [--from-dir DIR] [--sources NAME ...]
                        [--tokens-per-source N]   (stream the spec's sources from the HF hub into ROOT/raw/)
    infir-prep mixture  --spec YAML --output FILE [--root DIR]
    infir-prep demo     --root DIR          (the bundled demo data: corpus, SFT sets, eval problems)

Each command prints a summary (documents, tokens, skipped lines by reason with file:line
examples) and writes it beside the output as PREFIX.stats.json. Expected failures (missing,
unreadable or empty input, input whose every line is bad, missing tokenizer, bad spec) end with one
line naming the problem and exit code 2, and write no dataset; failed shards, and a fetch whose stream
broke off, end with exit code 1 (rerunning the same command resumes).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _summary(stats: dict) -> str:
    lines = [f"wrote {stats['output']}: " + ", ".join(
        f"{k}={stats[k]:,}" for k in ("documents", "samples", "tokens", "loss_tokens", "truncated") if k in stats)]
    skipped = stats.get("skipped", {})
    if skipped:
        lines.append(f"skipped {sum(skipped.values()):,} lines: " + ", ".join(f"{r}: {n}" for r, n in skipped.items()))
        examples = stats.get("skipped_examples", [])
        flat = [e for v in examples.values() for e in v] if isinstance(examples, dict) else examples
        lines += [f"  {e}" for e in flat[:10]]
        if stats.get("skipped_log"):
            lines.append(f"  (all skipped lines: {stats['skipped_log']})")
    return "\n".join(lines)


def _pretrain(args) -> None:
    from infir.data.tokenize_corpus import tokenize_to_indexed

    stats = tokenize_to_indexed(args.input, args.output, args.tokenizer, text_key=args.text_key,
                                workers=args.workers, shard_bytes=args.shard_mb << 20 if args.shard_mb else None)
    print(_summary(stats))


def _sft(args) -> None:
    from infir.data.sft import prepare_sft

    stats = prepare_sft(args.input, args.output, args.tokenizer, args.seq_length, overlong=args.overlong)
    print(_summary(stats))


def _fetch(args) -> None:
    from infir.data.fetch import fetch

    for spec in args.spec:
        shards = {"shard_tokens": args.shard_tokens} if args.shard_tokens else {}
        report = fetch(spec, args.root, args.tokenizer, from_dir=args.from_dir, only=args.sources,
                       tokens_per_source=args.tokens_per_source, **shards)
        print(_fetch_summary(report))


def _fetch_summary(report: dict) -> str:
    """Per source what was kept against its budget, the files written, and the commands that read them."""
    root, spec = report["root"], report["spec"]
    lines = []
    for name in report["fetched"]:
        s = report["states"][name]
        budget = f" (budget {s['budget']:,}: {s['tokens'] / s['budget'] - 1:+.2%})" if s["budget"] else ""
        skipped = "; skipped " + ", ".join(f"{r}: {n:,}" for r, n in s["skipped"].items()) if s["skipped"] else ""
        lines.append(f"{name}: {s['tokens']:,} tokens{budget}, {s['documents']:,} documents of {s['rows']:,} rows read, "
                     f"{s['shards']} shard(s), {'read to its end' if s['finished'] == 'exhausted' else 'budget met'}{skipped}")
    lines.append(f"wrote {root}/raw/<source>/part-*.parquet and {report['manifest']} (hub ids, licenses, counts)")
    prefixes = {str(src.get("name", Path(str(src["prefix"])).name)): src["prefix"]
                for phase in spec.phases for src in phase["sources"]}
    lines.append("next:")
    tok = report["tokenizer"]
    for name in report["states"]:
        if spec.write == "text":
            lines.append(f"  infir-prep pretrain --input {root}/raw/{name}/part-*.parquet "
                         f"--output {root}/{prefixes.get(name, 'cpt/' + name)} --tokenizer {tok}")
        else:
            lines.append(f"  infir-prep sft --input {root}/raw/{name}/part-*.parquet --output {root}/sft/{name} "
                         f"--tokenizer {tok} --seq-length 32768")
    if report["mixture"] is not None:
        lines.append(f"  infir-prep mixture --spec {report['mixture']} --output {root}/{spec.name}.resolved.yaml")
    return "\n".join(lines)


def _count(value: str) -> int:
    try:
        n = int(float(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of tokens: {value!r} (write 1000000 or 1e6)") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value!r}")
    return n


def _mixture(args) -> None:
    import yaml

    from infir.data.mixture import load_spec, write_resolved

    phases = load_spec(args.spec, root=args.root)
    name = (yaml.safe_load(Path(args.spec).read_text()) or {}).get("name", Path(args.spec).stem)
    write_resolved(phases, args.output, name=name)
    for p in phases:
        shares = ", ".join(
            f"{s.name} {s.weight:.1%}" + (f" ({s.epochs:g} epochs)" if s.epochs is not None else " (not built yet)")
            for s in p.sources)
        print(f"phase {p.name}: {p.tokens:,} tokens: {shares}")
    print(f"wrote {args.output}")


def _demo(args) -> None:
    from infir.data.demo import ensure_demo_data

    print(json.dumps(ensure_demo_data(args.root, workers=args.workers), indent=2))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infir-prep", description="Prepare training data for infir.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("pretrain", help="documents -> megatron indexed dataset (.bin/.idx)")
    p.add_argument("--input", nargs="+", required=True, type=Path,
                   help="jsonl, jsonl.gz, parquet files or saved HF dataset directories")
    p.add_argument("--output", required=True, help="output prefix (writes PREFIX.bin, PREFIX.idx, PREFIX.stats.json)")
    p.add_argument("--tokenizer", required=True, type=Path, help="HF tokenizer directory")
    p.add_argument("--text-key", default="text", help="field holding the document text (default: text)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tokenizer processes (default: all cores)")
    p.add_argument("--shard-mb", type=int, default=None, help="shard size for plain jsonl (default: auto)")
    p.set_defaults(run=_pretrain)

    p = sub.add_parser("sft", help="chat jsonl -> tokens + assistant-only loss masks, packed at load time")
    p.add_argument("--input", nargs="+", required=True, type=Path,
                   help="jsonl or parquet files with 'messages' or 'prompt'/'response', read in order")
    p.add_argument("--output", required=True, help="output prefix")
    p.add_argument("--tokenizer", required=True, type=Path, help="HF tokenizer directory (its chat template is used)")
    p.add_argument("--seq-length", required=True, type=int, help="training context length")
    p.add_argument("--overlong", choices=("drop", "truncate"), default="drop",
                   help="samples longer than the context: drop (default) or keep the first seq-length+1 tokens")
    p.set_defaults(run=_sft)

    _add_fetch_parser(sub)

    p = sub.add_parser("mixture", help="mixture spec (sources, weights or token budgets, phases) -> resolved blends")
    p.add_argument("--spec", required=True, type=Path)
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--root", type=Path, default=None, help="resolve relative prefixes against this folder")
    p.set_defaults(run=_mixture)

    p = sub.add_parser("demo", help="build the bundled demo data")
    p.add_argument("--root", required=True, type=Path)
    p.add_argument("--workers", type=int, default=None)
    p.set_defaults(run=_demo)
    return parser


def _add_fetch_parser(sub) -> None:
    p = sub.add_parser("fetch", help="stream a spec's sources from the HF hub into parquet shards (resumable)")
    p.add_argument("--spec", nargs="+", required=True, type=Path,
                   help="fetch specs: data_prep/mixtures/infir2_cpt.yaml, data_prep/mixtures/infialign_sft.yaml")
    p.add_argument("--root", required=True, type=Path, help="output folder (ROOT/raw/<source>/, ROOT/<spec>.fetch.json)")
    p.add_argument("--tokenizer", required=True, type=Path, help="HF tokenizer directory: tokens are counted with it")
    p.add_argument("--from-dir", type=Path, default=None,
                   help="read DIR/<hub id>/ (a copy of each dataset's repository) instead of the hub")
    p.add_argument("--sources", nargs="+", default=None, help="only these sources (default: all of the spec)")
    p.add_argument("--tokens-per-source", type=_count, default=None,
                   help="every source's budget (a subset; default: the spec's budgets)")
    p.add_argument("--shard-tokens", type=_count, default=None, help="tokens per output shard (default: 50M)")
    p.set_defaults(run=_fetch)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from infir.data.fetch import FetchInterrupted
    from infir.data.mixture import MixtureError
    from infir.data.tokenize_corpus import ShardFailed
    from infir.data.tokenizer import TokenizerNotFound

    try:
        args.run(args)
    except (FileNotFoundError, TokenizerNotFound, MixtureError, ValueError) as err:
        print(f"infir-prep {args.command}: error: {err}", file=sys.stderr)
        return 2
    except (ShardFailed, FetchInterrupted) as err:
        print(f"infir-prep {args.command}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
