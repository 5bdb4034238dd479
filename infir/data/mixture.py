"""Weighted multi-source mixtures with phases: a YAML spec -> resolved megatron blends per phase.

Spec (``data_prep/mixtures/*.yaml``)::

    name: infir2_cpt
    root: /data/infir2          # optional; relative prefixes are resolved against it
                                # (default: the spec file's folder)
    phases:
      - name: general
        tokens: 140e9           # phase length; optional when every source gives a token budget
        sources:
          - {name: fineweb, prefix: fineweb/text_document, weight: 0.6}
          - {name: stack_edu, prefix: stack_edu/text_document, weight: 0.4}
      - name: reasoning
        sources:                # token budgets instead of weights: shares = budget / sum
          - {name: general, prefix: fineweb/text_document, tokens: 10e9}
          - {name: am_r1, prefix: am_r1/text_document, tokens: 10e9}

Within a phase every source has either ``weight`` or ``tokens``, not a mix. The resolved file
(``infir-prep mixture --output FILE``) lists per phase: tokens, normalised weights, megatron's
``blend`` (``[[prefixes], [weights]]``) and, where a prefix is already built, the tokens on disk and
how many epochs of it the phase reads. Shares are token shares: every megatron sample is
``seq_length`` tokens, so a blend weight is the phase's share of tokens.

``phase_schedule`` turns phases into consecutive iteration ranges for a run (``stage=cpt``);
``infir.data.pretrain.build_phase_datasets`` gives a phase's train/valid datasets.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml


class MixtureError(ValueError):
    pass


@dataclass
class Source:
    name: str
    prefix: str
    weight: float                    # normalised within the phase
    budget: float | None = None      # tokens, when the spec gave a budget
    available_tokens: int | None = None
    epochs: float | None = None


@dataclass
class Phase:
    name: str
    tokens: int
    sources: list[Source] = field(default_factory=list)

    @property
    def blend(self) -> tuple[list[str], list[float]]:
        return [s.prefix for s in self.sources], [s.weight for s in self.sources]


def _number(value, where: str) -> float:
    try:
        x = float(value)  # accepts 140e9 written as a YAML string
    except (TypeError, ValueError):
        raise MixtureError(f"{where} must be a number, got {value!r}") from None
    if not math.isfinite(x) or x < 0:
        raise MixtureError(f"{where} must be a finite number >= 0, got {value!r}")
    return x


def _indexed_tokens(prefix: str) -> int | None:
    if not (Path(prefix + ".idx").is_file() and Path(prefix + ".bin").is_file()):
        return None
    from infir.data.tokenize_corpus import megatron_indexed

    # Keep the dataset alive while summing: sequence_lengths is a view of its mmap, which the
    # dataset's __del__ closes (summing after that reads unmapped memory).
    dataset = megatron_indexed().IndexedDataset(prefix)
    tokens = int(dataset.sequence_lengths.sum())
    del dataset
    return tokens


def parse_mixture(spec: dict, base_dir: Path, root: Path | None = None) -> list[Phase]:
    if not isinstance(spec, dict) or not isinstance(spec.get("phases"), list) or not spec["phases"]:
        raise MixtureError("a mixture spec needs a non-empty list 'phases'")
    # "." when unset, not base_dir itself: a relative base_dir joined to itself doubled every prefix.
    root = Path(root) if root is not None else Path(spec.get("root") or ".")
    if not root.is_absolute():
        root = base_dir / root
    phases, names = [], set()
    for i, p in enumerate(spec["phases"]):
        where = f"phases[{i}]"
        if not isinstance(p, dict) or not isinstance(p.get("sources"), list) or not p["sources"]:
            raise MixtureError(f"{where} needs a non-empty list 'sources'")
        name = str(p.get("name", f"phase{i + 1}"))
        if name in names:
            raise MixtureError(f"{where}: phase name '{name}' is used twice")
        names.add(name)
        kinds = {("weight" in s) + 2 * ("tokens" in s) for s in p["sources"] if isinstance(s, dict)}
        if kinds not in ({1}, {2}):
            raise MixtureError(f"{where} ({name}): give every source exactly one of 'weight' or 'tokens' "
                               "(all sources of a phase the same kind)")
        by_budget = kinds == {2}
        raw, sources = [], []
        for j, s in enumerate(p["sources"]):
            sw = f"{where}.sources[{j}]"
            if "prefix" not in s:
                raise MixtureError(f"{sw} needs 'prefix' (an indexed dataset path without .bin/.idx)")
            prefix = Path(str(s["prefix"]))
            prefix = prefix if prefix.is_absolute() else root / prefix
            raw.append(_number(s["tokens" if by_budget else "weight"], f"{sw}.{'tokens' if by_budget else 'weight'}"))
            sources.append(Source(name=str(s.get("name", prefix.name)), prefix=str(prefix), weight=0.0))
        total = sum(raw)
        if total <= 0:
            raise MixtureError(f"{where} ({name}): weights/budgets sum to 0")
        if by_budget:
            tokens = total if p.get("tokens") is None else _number(p["tokens"], f"{where}.tokens")
            if abs(tokens - total) > 1e-6 * total:
                raise MixtureError(f"{where} ({name}): tokens={tokens:.6g} but the source budgets sum to {total:.6g}")
        else:
            if p.get("tokens") is None:
                raise MixtureError(f"{where} ({name}): weighted sources need the phase's 'tokens'")
            tokens = _number(p["tokens"], f"{where}.tokens")
        for s, r in zip(sources, raw):
            s.weight = r / total
            s.budget = r if by_budget else None
            s.available_tokens = _indexed_tokens(s.prefix)
            if s.available_tokens:
                s.epochs = round(s.weight * tokens / s.available_tokens, 4)
        phases.append(Phase(name=name, tokens=int(tokens), sources=sources))
    return phases


def load_spec(path: Path | str, root: Path | None = None) -> list[Phase]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"mixture spec {path} does not exist")
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise MixtureError(f"{path} is not valid YAML: {err}") from None
    try:
        return parse_mixture(spec, path.parent.resolve(), root)
    except MixtureError as err:
        raise MixtureError(f"{path}: {err}") from None


def write_resolved(phases: list[Phase], out: Path | str, name: str = "") -> dict:
    resolved = {
        "name": name,
        "phases": [
            {"name": p.name, "tokens": p.tokens, "blend": [list(p.blend[0]), list(p.blend[1])],
             "sources": [asdict(s) for s in p.sources]}
            for p in phases
        ],
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(resolved, sort_keys=False))
    return resolved


def load_resolved(path: Path | str) -> list[Phase]:
    """The phases of a resolved mixture file; MixtureError naming the file when it is not one."""
    try:
        data = yaml.safe_load(Path(path).read_text())
        return [Phase(name=p["name"], tokens=int(p["tokens"]), sources=[Source(**s) for s in p["sources"]])
                for p in data["phases"]]
    except (yaml.YAMLError, UnicodeDecodeError, KeyError, TypeError, ValueError) as err:
        raise MixtureError(f"{path} is not a resolved mixture file ({type(err).__name__}: {err}); "
                           "write it with `infir-prep mixture --spec SPEC --output FILE`") from None


def phase_schedule(phases: list[Phase], seq_length: int, global_batch: int) -> list[dict]:
    """Consecutive iteration ranges, one per phase: ``{"name", "start", "end", "samples"}``
    (``end`` exclusive), each phase long enough to cover its tokens."""
    out, start = [], 0
    for p in phases:
        iters = max(1, math.ceil(p.tokens / (seq_length * global_batch)))
        out.append({"name": p.name, "start": start, "end": start + iters, "samples": iters * global_batch})
        start += iters
    return out
