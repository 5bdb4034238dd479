"""`infir-compare`: FP8 vs BF16 side by side, as one HTML page with PNG plots (and optionally on W&B).

    infir-compare outputs/demo --out outputs/demo/report
    infir-compare runs/tiny-bf16/cpt runs/tiny-fp8_blockwise_ue8m0/cpt wandb/offline-run-* --out report
    infir-compare outputs/demo --out report --wandb-project infir     # also push to W&B

Each path is a run dir (metrics.jsonl + summary.json), a W&B offline run dir, or any folder holding
them (searched recursively, eval summaries included). Runs of one model and stage are compared with
that stage's baseline-precision run (`--baseline`, bf16 by default). A plain argparse CLI rather than
Hydra: it has four options and no config tree.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from infir.report import html, plots
from infir.report.pairing import pairs as make_pairs
from infir.report.runs import discover


def build_report(paths: list[Path], out_dir: Path, baseline: str = "bf16", title: str = "infir: FP8 vs BF16"):
    """Write out_dir/index.html + out_dir/plots/*.png; return (runs, pairs, evals, [(slug, caption, png)])."""
    runs, evals = discover(paths)
    pairs = make_pairs(runs, baseline)
    plot_dir = out_dir / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for slug, caption, fig in plots.all_figures(runs, pairs, evals, baseline):
        png = plot_dir / f"{slug}.png"
        fig.savefig(png, dpi=110, bbox_inches="tight")  # keeps legends placed outside the axes
        plots.plt.close(fig)
        written.append((slug, caption, png))
    page = html.render(runs, pairs, evals, [(f"plots/{p.name}", c) for _s, c, p in written], title)
    (out_dir / "index.html").write_text(page)
    return runs, pairs, evals, written


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="infir-compare", description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", type=Path, help="run dirs, W&B offline run dirs, or folders holding them")
    ap.add_argument("--out", type=Path, required=True, help="report folder (index.html + plots/)")
    ap.add_argument("--baseline", default="bf16", help="precision every other run is compared with (default: bf16)")
    ap.add_argument("--title", default="infir: FP8 vs BF16")
    ap.add_argument("--wandb-project", help="also log the report to this W&B project")
    ap.add_argument("--wandb-entity")
    ap.add_argument("--wandb-mode", choices=["online", "offline"], default="online")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        runs, pairs, evals, written = build_report(args.paths, args.out, args.baseline, args.title)
    except (OSError, ValueError) as err:  # a missing or unreadable run, or an --out that cannot be written
        print(f"infir-compare: {err}", file=sys.stderr)
        return 2
    print(f"infir-compare: {len(runs)} runs, {len(pairs)} {args.baseline} pairs, {len(evals)} eval results, "
          f"{len(written)} plots -> {args.out / 'index.html'}")
    if args.wandb_project:
        from infir.report.wandb_push import push

        where = push(args.out, args.title, runs, pairs, evals, written, args.wandb_project, args.wandb_entity,
                     args.wandb_mode)
        print(f"infir-compare: pushed to W&B: {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
