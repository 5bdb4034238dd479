"""infir.train.metrics.RunLogger: which W&B mode a run gets from logger= and $WANDB_MODE."""
import sys
from types import SimpleNamespace

import pytest

from infir.train.cli import compose
from infir.train.metrics import RunLogger


@pytest.mark.parametrize("logger, env, mode", [
    ("none", "offline", None),              # logger=none: no W&B whatever the environment says
    ("none", "online", None),
    ("wandb_offline", "online", "online"),  # otherwise $WANDB_MODE wins, as in wandb itself
    ("wandb_online", "disabled", None),
    ("wandb_offline", None, "offline"),
])
def test_wandb_mode_from_logger_and_environment(tmp_path, monkeypatch, logger, env, mode):
    started = []
    monkeypatch.setitem(sys.modules, "wandb", SimpleNamespace(init=lambda **kw: started.append(kw["mode"])))
    if env is None:
        monkeypatch.delenv("WANDB_MODE", raising=False)
    else:
        monkeypatch.setenv("WANDB_MODE", env)
    RunLogger(compose([f"logger={logger}", f"run_dir={tmp_path}"]), tmp_path, enabled=True)
    assert started == ([] if mode is None else [mode])
