"""Pretraining datasets through megatron-core's own GPTDataset / BlendedMegatronDatasetBuilder.

``build_pretrain_datasets`` hides megatron's config objects: give it one prefix, a list of
prefixes, ``[(weight, prefix), ...]`` or megatron's ``([prefixes], [weights])``, and get back
``(train, valid)`` datasets whose items are ``{"tokens", "labels", "loss_mask", "position_ids"}``
(int64 / float32 tensors of length ``seq_length``). Documents are packed back to back, separated by
EOD, with no attention reset (megatron's default for pretraining). ``build_phase_datasets`` does the
same for one phase of a mixture (infir.data.mixture), sized to the phase's tokens.

CPU note: megatron's sample-index builder is a C++ extension (``helpers_cpp``); the megatron-core
wheel ships it prebuilt, so nothing compiles at run time (``tests/data/test_pretrain.py`` imports
it). Index caches go to ``cache_dir`` (default: ``<prefix dir>/cache``, megatron's choice); under
torch.distributed megatron builds them on rank 0 first and the other ranks read them.
"""
from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import warnings
from pathlib import Path

import torch

from infir.data.checks import Blend, blend_parts, indexed_problem, is_mixture_file
from infir.data.mixture import Phase, load_resolved, phase_schedule
from infir.data.tokenizer import MegatronTokenizerAdapter, TextTokenizer, load_tokenizer


def normalize_blend(blend: Blend) -> tuple[list[str], list[float] | None]:
    """Any accepted blend spelling -> megatron's ``([prefixes], [weights] or None)``; every prefix
    must be a whole indexed dataset (``infir.data.checks``)."""
    prefixes, weights = blend_parts(blend)
    if weights is not None:
        if len(weights) != len(prefixes):
            raise ValueError(f"blend has {len(prefixes)} prefixes but {len(weights)} weights")
        if any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"blend weights must be >= 0 with a positive sum, got {weights}")
    for p in prefixes:
        if (problem := indexed_problem(p)) is not None:
            raise FileNotFoundError(f"no indexed dataset at prefix {p} ({problem}): "
                                    "build it with `infir-prep pretrain --output PREFIX ...`")
    return prefixes, weights


def _gpt_config(seq_length: int, tok: TextTokenizer, seed: int, cache_dir, reset_at_eod: bool = False, **blend_kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    return GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_length,
        tokenizer=MegatronTokenizerAdapter(tok),
        # Positions restarting after each EOD are all the trainer needs: it reads document
        # boundaries off them (infir.model.documents), so megatron builds no [s, s] mask.
        reset_position_ids=reset_at_eod,
        reset_attention_mask=reset_at_eod,
        eod_mask_loss=False,
        create_attention_mask=False,
        path_to_cache=str(cache_dir) if cache_dir is not None else None,
        **blend_kwargs,
    )


def build_pretrain_datasets(
    blend: Blend,
    seq_length: int,
    tokenizer: TextTokenizer | str | Path,
    *,
    train_samples: int | None = None,
    valid_samples: int | None = None,
    split: str = "99,1,0",
    valid_blend: Blend | None = None,
    seed: int = 1234,
    cache_dir: str | Path | None = None,
    reset_at_eod: bool = False,
):
    """Return ``(train_ds, valid_ds)`` megatron datasets (valid_ds may be None).

    ``reset_at_eod``: each sample's ``position_ids`` restart after every EOD token (Megatron-LM's
    ``--reset-position-ids --reset-attention-mask``), so each document attends only itself.

    ``blend`` may also be a resolved mixture file (``*.yaml`` from ``infir-prep mixture``): the
    train set is then a ``PhasedDataset`` running the phases in order.

    Validation comes from ``valid_blend`` when given (e.g. the demo's ``pretrain_valid`` prefix),
    else from the ``split`` share of each prefix's documents. ``*_samples`` fix how many
    sequences each split draws (needed with weights: megatron then repeats epochs as required);
    None means one epoch.
    """
    if seq_length < 1:
        raise ValueError(f"seq_length must be >= 1, got {seq_length}")
    tok = tokenizer if isinstance(tokenizer, TextTokenizer) else load_tokenizer(tokenizer)
    if is_mixture_file(blend):
        return _build_phased(Path(blend), seq_length, tok, train_samples=train_samples, valid_samples=valid_samples,
                             split=split, valid_blend=valid_blend, seed=seed, cache_dir=cache_dir, reset_at_eod=reset_at_eod)
    train_blend = normalize_blend(blend)
    if valid_blend is not None:
        blend_kwargs = {"blend_per_split": [train_blend, normalize_blend(valid_blend), None]}
        needs_size = [train_blend[1] is not None, normalize_blend(valid_blend)[1] is not None]
    else:
        blend_kwargs = {"blend": train_blend, "split": split}
        needs_size = [train_blend[1] is not None] * 2
        _check_split_has_documents(train_blend[0], split, want_valid=valid_samples != 0)
    for name, n, need in (("train_samples", train_samples, needs_size[0]), ("valid_samples", valid_samples, needs_size[1])):
        if need and n is None:
            raise ValueError(f"a weighted blend needs {name}: megatron draws that many sequences by weight")
    config = _gpt_config(seq_length, tok, seed, cache_dir, reset_at_eod, **blend_kwargs)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset
    # megatron logs every index it builds at INFO; the loop's own logging says what matters.
    logging.getLogger("megatron.core.datasets").setLevel(logging.WARNING)
    # The test split is unused; megatron wants a size (0) for it whenever the blend is weighted.
    sizes = [train_samples, valid_samples, 0 if train_blend[1] is not None else None]
    with _process_group_for_megatron():
        train, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
    return train, valid


class PhasedDataset(torch.utils.data.Dataset):
    """The phases of a mixture back to back: indices ``[0, n_1)`` are phase 1's samples, then phase 2's...

    ``sequential = True`` tells the loop to read it in index order (each phase's megatron dataset is
    already shuffled inside); a loop that permutes indices globally would blend the phases.
    """

    sequential = True

    def __init__(self, names: list[str], datasets: list):
        self.names, self.datasets = names, datasets
        self.ends = list(itertools.accumulate(len(d) for d in datasets))

    @property
    def phase_bounds(self) -> list[tuple[str, int, int]]:
        starts = [0] + self.ends[:-1]
        return list(zip(self.names, starts, self.ends))

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __getitem__(self, idx: int):
        if not 0 <= idx < len(self):
            raise IndexError(f"index {idx} out of range for {len(self)} samples")
        k = bisect.bisect_right(self.ends, idx)
        return self.datasets[k][idx - (self.ends[k - 1] if k else 0)]


def build_phase_datasets(phase: Phase, seq_length: int, tokenizer, *, global_batch: int = 1,
                         valid_samples: int | None = None, valid_blend=None, split: str = "99,1,0",
                         seed: int = 1234, cache_dir=None):
    """A phase's ``(train, valid)`` megatron datasets, sized to the phase's tokens."""
    samples = phase_schedule([phase], seq_length, global_batch)[0]["samples"]
    return build_pretrain_datasets(
        phase.blend, seq_length, tokenizer, train_samples=samples,
        valid_samples=valid_samples if valid_samples is not None else max(1, samples // 100),
        split=split, valid_blend=valid_blend, seed=seed, cache_dir=cache_dir)


def _build_phased(path: Path, seq_length: int, tok: TextTokenizer, *, train_samples, valid_samples, split,
                  valid_blend, seed, cache_dir, reset_at_eod):
    """A resolved mixture file (``infir-prep mixture``) -> (PhasedDataset, valid). Without
    ``train_samples`` each phase draws its own tokens; with it, the samples are shared out in
    proportion to the phases' tokens. Validation comes from ``valid_blend`` or phase 1's split."""
    phases = load_resolved(path)
    if train_samples is None:
        counts = [max(1, -(-p.tokens // seq_length)) for p in phases]
    else:
        total = sum(p.tokens for p in phases)
        bounds = [round(train_samples * c / total) for c in itertools.accumulate(p.tokens for p in phases)]
        counts = [b - a for a, b in zip([0] + bounds[:-1], bounds)]
    trains, valid = [], None
    for i, (phase, n) in enumerate(zip(phases, counts)):
        train, v = build_pretrain_datasets(
            phase.blend, seq_length, tok, train_samples=n, valid_samples=valid_samples if i == 0 else 0,
            split=split, valid_blend=valid_blend, seed=seed + i, cache_dir=cache_dir, reset_at_eod=reset_at_eod)
        trains.append(train)
        valid = v if i == 0 else valid
    return PhasedDataset([p.name for p in phases], trains), valid


def _check_split_has_documents(prefixes: list[str], split: str, want_valid: bool) -> None:
    """megatron cuts each prefix's documents by ``split``; a split left with no document makes its
    epoch-count loop spin forever, so refuse it here with the numbers."""
    from infir.data.tokenize_corpus import megatron_indexed

    shares = [float(x) for x in split.split(",")] + [0.0, 0.0]
    total = sum(shares[:3])
    if total <= 0:
        raise ValueError(f"split {split!r} has no positive share")
    train_end, valid_end = shares[0] / total, (shares[0] + shares[1]) / total
    for prefix in prefixes:
        dataset = megatron_indexed().IndexedDataset(prefix)
        n = len(dataset)
        del dataset
        n_train = int(round(train_end * n))
        n_valid = int(round(valid_end * n)) - n_train
        if n_train == 0 or (want_valid and shares[1] > 0 and n_valid == 0):
            raise ValueError(
                f"{prefix} has {n} documents: split {split!r} leaves its {'train' if n_train == 0 else 'validation'} "
                "part with none; use a split with larger shares, more documents, or a separate valid_blend")


@contextlib.contextmanager
def _process_group_for_megatron():
    """megatron-core 0.16's BlendedDataset calls ``torch.distributed.get_rank()`` when it caches
    its index, which fails in a plain single-process run (CPU tests, the demo). There we open a
    one-rank gloo group for the duration of the build; under torchrun the real group is used."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
