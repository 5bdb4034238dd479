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
    """The config `infir-train OVERRIDES...` would run, for benches and tests (no Hydra run dir)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    _quiet_megatron()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return hydra_compose(config_name="config", overrides=list(overrides or []))


def _quiet_megatron() -> None:
    # megatron-core warns on import that Transformer Engine / apex are absent (infir never needs them)
    # and logs every DDP bucket's parameter list at INFO.
    import logging

    warnings.filterwarnings("ignore", message=".*Transformer Engine.*")
    warnings.filterwarnings("ignore", message=".*apex.*", category=UserWarning)
    logging.getLogger("megatron").setLevel(logging.WARNING)


def run(cfg) -> dict:
    from infir.train import config as validation
    from infir.train import dist as distributed
    from infir.train.checkpoint import CheckpointWriteError
    from infir.train.loop import NonFiniteError, Trainer

    validation.validate(cfg)
    trainer = None
    try:
        trainer = Trainer(cfg)
        return trainer.train()
    except NonFiniteError as e:
        print(f"infir-train: {e}", file=sys.stderr, flush=True)
        raise SystemExit(3)
    except CheckpointWriteError as e:
        print(f"infir-train: {e}", file=sys.stderr, flush=True)
        raise SystemExit(4)
    finally:
        if trainer is not None:
            trainer.log.finish()
        distributed.shutdown()


def main() -> None:
    _quiet_megatron()
    import hydra

    hydra.main(config_path=str(conf_dir()), config_name="config", version_base=None)(run)()


if __name__ == "__main__":
    main()
