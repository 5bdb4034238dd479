"""A fetch spec: the sources ``infir-prep fetch`` streams from the HF hub, each with its dataset id,
license and field mapping, beside the mixture that reads them (``data_prep/mixtures/*.yaml``)::

    name: infir2_cpt
    write: text                # text: one document per row, for `infir-prep pretrain` (conversations
                               # rendered with the tokenizer's chat template); messages: chat rows for `infir-prep sft`
    sources:
      fineweb:
        hub: HuggingFaceFW/fineweb
        config: sample-100BT   # or a list of configs, read interleaved; default: the dataset's default
        split: train           # default
        revision: null         # a commit or tag, to pin what is read
        data_files: null       # file globs inside the repository, instead of its configs
        license: odc-by-1.0    # recorded in the fetch manifest
        text: text             # the field holding the document ...
      am_qwen3:
        hub: a-m-team/AM-Qwen3-Distilled
        messages: {field: conversations, role: from, content: value}   # ... or the conversation
    phases: ...                # the mixture (infir.data.mixture), its sources named as above

A source's token budget is what the phases read of it (a phase's share times its tokens, summed over
phases); a spec without phases gives ``budget:`` per source, or none (the whole dataset).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import yaml

from infir.data.chat import BadSample, to_messages
from infir.data.mixture import MixtureError, parse_mixture

WRITES = ("text", "messages")
# The role names of the common chat layouts (OpenAI's messages, ShareGPT's conversations) -> ChatML's.
ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant"}
SOURCE_KEYS = {"hub", "config", "split", "revision", "data_files", "license", "text", "messages",
               "software_heritage", "budget"}


@dataclass(frozen=True)
class ChatFields:
    """Where a row keeps its conversation: a list under ``field`` of turns with ``role`` and ``content``."""
    field: str = "messages"
    role: str = "role"
    content: str = "content"
    system: str | None = None  # a row field holding a system prompt, when the layout keeps it apart

    def messages(self, row: dict) -> list[dict]:
        """The row's conversation as ``[{role, content}]`` with ChatML roles; BadSample when unusable."""
        turns = row.get(self.field)
        if not isinstance(turns, list) or not turns:
            raise BadSample(f"field '{self.field}' is not a non-empty list of turns")
        out = []
        if self.system and isinstance(row.get(self.system), str) and row[self.system].strip():
            out.append({"role": "system", "content": row[self.system]})
        for turn in turns:
            role = ROLES.get(turn.get(self.role)) if isinstance(turn, dict) else None
            if role is None:
                raise BadSample(f"a turn without a known '{self.role}' (system, user/human, assistant/gpt)")
            out.append({"role": role, "content": turn.get(self.content)})
        return to_messages({"messages": out})


@dataclass(frozen=True)
class SoftwareHeritage:
    """Rows without text name their file by Software Heritage blob id (Stack-Edu)."""
    blob: str = "blob_id"
    encoding: str = "src_encoding"


@dataclass(frozen=True)
class FetchSource:
    name: str
    hub: str
    configs: tuple = (None,)
    split: str = "train"
    revision: str | None = None
    data_files: tuple = ()
    license: str = ""
    text: str | None = None
    chat: ChatFields | None = None
    software_heritage: SoftwareHeritage | None = None
    budget: int | None = None  # tokens to keep; None = the whole dataset

    def settings(self) -> dict:
        """What decides which rows are read and how they become documents (not the budget)."""
        keep = ("hub", "configs", "split", "revision", "data_files", "text", "chat", "software_heritage")
        return {k: v for k, v in asdict(self).items() if k in keep}


@dataclass
class FetchSpec:
    name: str
    path: Path
    write: str
    sources: dict[str, FetchSource]
    phases: list[dict] = field(default_factory=list)  # as written, for the fetched mixture
    shares: dict[str, dict[str, float]] = field(default_factory=dict)  # phase -> source -> share of its budget


def _listed(value, where: str) -> tuple:
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) and v for v in values):
        raise MixtureError(f"{where} must be a name or a list of names, got {value!r}")
    return tuple(values)


def _source(name: str, entry, write: str) -> FetchSource:
    where = f"sources.{name}"
    if not isinstance(entry, dict) or not isinstance(entry.get("hub"), str):
        raise MixtureError(f"{where} needs 'hub': the dataset's id on the Hugging Face hub (owner/name)")
    unknown = set(entry) - SOURCE_KEYS
    if unknown:
        raise MixtureError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(SOURCE_KEYS)}")
    if ("text" in entry) == ("messages" in entry):
        raise MixtureError(f"{where} needs exactly one of 'text' (the document's field) or 'messages' (the conversation's fields)")
    if write == "messages" and "messages" not in entry:
        raise MixtureError(f"{where}: a spec that writes messages (chat rows for `infir-prep sft`) needs 'messages' fields")
    chat = entry.get("messages")
    try:
        chat = ChatFields(**({"field": chat} if isinstance(chat, str) else chat)) if chat is not None else None
        swh = entry.get("software_heritage")
        swh = SoftwareHeritage(**swh) if isinstance(swh, dict) else (SoftwareHeritage() if swh else None)
    except TypeError as err:
        raise MixtureError(f"{where}: {err}") from None
    if entry.get("software_heritage") and "text" not in entry:
        raise MixtureError(f"{where}: 'software_heritage' fills the 'text' field of rows without it; name that field")
    budget = entry.get("budget")
    if budget is not None and (not isinstance(budget, (int, float)) or budget <= 0):
        raise MixtureError(f"{where}.budget must be a positive number of tokens, got {budget!r}")
    return FetchSource(name=name, hub=entry["hub"], configs=_listed(entry.get("config"), f"{where}.config") or (None,),
                       split=str(entry.get("split", "train")), revision=entry.get("revision"),
                       data_files=_listed(entry.get("data_files"), f"{where}.data_files"),
                       license=str(entry.get("license", "")), text=entry.get("text"), chat=chat,
                       software_heritage=swh, budget=int(budget) if budget is not None else None)


def _phase_budgets(spec: dict, path: Path, sources: dict[str, FetchSource]) -> dict[str, dict[str, float]]:
    """phase -> source -> the tokens the phase reads of it (its share of the phase's tokens)."""
    budgets = {}
    for phase in parse_mixture(spec, path.parent.resolve()):
        for s in phase.sources:
            if s.name not in sources:
                raise MixtureError(f"phase {phase.name} reads '{s.name}', which 'sources' does not declare")
            budgets.setdefault(phase.name, {})[s.name] = s.weight * phase.tokens
    return budgets


def load_fetch_spec(path: Path | str) -> FetchSpec:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"fetch spec {path} does not exist")
    try:
        spec = yaml.safe_load(path.read_text())
        write = spec.get("write", "text") if isinstance(spec, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("sources"), dict) or not spec["sources"]:
            raise MixtureError("a fetch spec needs a mapping 'sources' (name -> hub id, license, fields)")
        if write not in WRITES:
            raise MixtureError(f"'write' must be one of {WRITES}, got {write!r}")
        sources = {str(n): _source(str(n), e, write) for n, e in spec["sources"].items()}
        budgets = _phase_budgets(spec, path, sources) if spec.get("phases") else {}
    except yaml.YAMLError as err:
        raise MixtureError(f"{path} is not valid YAML: {err}") from None
    except MixtureError as err:
        raise MixtureError(f"{path}: {err}") from None
    for name, source in sources.items() if budgets else ():
        if source.budget is not None:
            raise MixtureError(f"{path}: sources.{name}.budget: a spec with phases takes budgets from them")
        total = round(sum(b.get(name, 0.0) for b in budgets.values()))
        if not total:
            raise MixtureError(f"{path}: no phase reads sources.{name}; read it in a phase or remove it")
        sources[name] = replace(source, budget=total)
    shares = {p: {n: b / sources[n].budget for n, b in by.items()} for p, by in budgets.items()}
    return FetchSpec(name=str(spec.get("name", path.stem)), path=path, write=write, sources=sources,
                     phases=spec.get("phases") or [], shares=shares)
