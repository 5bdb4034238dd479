"""`infir-train`: the Hydra entry point. With no arguments: the tiny model on the bundled demo data."""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path


def conf_dir() -> Path:
    """conf/ of the checkout (editable installs and the Docker image), or $INFIR_CONF."""
    path = Path(os.environ.get("INFIR_CONF", Path(__file__).resolve().parents[2] / "conf"))
    if not (path / "config.yaml").exists():
        raise SystemExit(f"infir: no config.yaml in {path}; install infir from its checkout (pip install -e .) or set INFIR_CONF to its conf/ directory")
    return path


def compose(overrides: list[str] | None = None):
    """The config `infir-train OVERRIDES...` would run, for benches and tests (no Hydra run dir); a key
    its group does not have, a wrong type or an out-of-range value raises one ConfigError line."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    from infir.train.config import composition_error, typed
    from infir.train.schema import register

    _quiet_megatron()
    register()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        try:
            cfg = hydra_compose(config_name="config", overrides=list(overrides or []))
        except HydraException as e:
            raise composition_error(e) from None
    typed(cfg)
    return cfg


def _quiet_megatron() -> None:
    # megatron-core warns on import that Transformer Engine / apex are absent (infir never needs them)
    # and logs every DDP bucket's parameter list at INFO.
    import logging

    warnings.filterwarnings("ignore", message=".*Transformer Engine.*")
    warnings.filterwarnings("ignore", message=".*apex.*", category=UserWarning)
    logging.getLogger("megatron").setLevel(logging.WARNING)


def _exit_on_bad_config(check) -> None:
    """Run `check`; a ConfigError ends the program with its one line and exit code 2 (bad usage)."""
    from infir.train.config import ConfigError

    try:
        check()
    except ConfigError as e:
        print(f"infir-train: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2)


def run(cfg) -> dict:
    import torch

    from infir.train import config as validation
    from infir.train import dist as distributed
    from infir.train.checkpoint import CheckpointWriteError
    from infir.train.loop import NonFiniteError, SpikeError, Trainer

    _exit_on_bad_config(lambda: validation.validate(cfg))
    trainer = None
    try:
        trainer = Trainer(cfg)
        return trainer.train()
    except validation.ConfigError as e:  # found only once the run dir is read (a resume that reorders the data)
        print(f"infir-train: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2)
    except (NonFiniteError, SpikeError) as e:
        print(f"infir-train: {e}", file=sys.stderr, flush=True)
        raise SystemExit(3)
    except KeyboardInterrupt:  # Ctrl-C before the loop's handler is in place, or a second one
        print("infir-train: stopped by Ctrl-C, without a checkpoint of this step; rerun the same command to resume "
              "from the last one", file=sys.stderr, flush=True)
        raise SystemExit(130)
    except CheckpointWriteError as e:
        print(f"infir-train: {e}", file=sys.stderr, flush=True)
        raise SystemExit(4)
    except torch.OutOfMemoryError as e:
        print(f"infir-train: {out_of_memory(e, trainer)}", file=sys.stderr, flush=True)
        raise SystemExit(5)
    finally:
        if trainer is not None:
            trainer.log.finish()
        distributed.shutdown()


def out_of_memory(error: Exception, trainer) -> str:
    """The one line for a GPU out-of-memory stop: where, what torch tried to allocate, and what frees memory."""
    import re

    tried = re.search(r"Tried to allocate ([\d.]+ \w+)", str(error))
    where = f"in step {trainer.step + 1}" if trainer is not None else "while building the model"
    what = f" (tried to allocate {tried.group(1)})" if tried else ""
    return (f"out of GPU memory {where}{what}: lower stage.micro_batch (gradient accumulation keeps stage.global_batch), "
            "set model.recompute=full, use optimizer=flash_adamw, or run on more GPUs (parallel=tp2 or tp4 splits the "
            "model; each added data-parallel rank shrinks every rank's share of the optimizer states); checkpoints "
            "already written are kept, and the run resumes from the last one")


def main() -> None:
    """Hydra's main, once the config composed from the command line passed validation: Hydra would
    report a bad key in a multi-line traceback after making run_dir, this in one line."""
    _quiet_megatron()
    import hydra
    from hydra._internal.utils import get_args_parser  # the parser hydra.main reads the command line with

    from infir.train.config import validate
    from infir.train.schema import register

    args = get_args_parser().parse_args()
    if not (args.multirun or args.config_dir or args.config_name or args.config_path):  # else: checked in run
        _exit_on_bad_config(lambda: validate(compose(args.overrides)))
    register()
    hydra.main(config_path=str(conf_dir()), config_name="config", version_base=None)(run)()


if __name__ == "__main__":
    main()
