#!/usr/bin/env bash
# One-time setup of a fresh machine for infir (idempotent; reruns take seconds).
#   - torch: kept if importable (any CUDA build on GPU hosts); else the CPU build 2.13.0.
#   - infir itself, editable (its Hydra configs live in conf/ of this checkout), with test extras.
#   - Debian tools the tests use when root and apt-get exist: bubblewrap (the code-execution sandbox of
#     infir-eval) and chromium (renders the infir-compare report in a test).
set -euo pipefail
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q "torch==2.13.0" || "$PY" -m pip install -q --index-url https://download.pytorch.org/whl/cpu torch
fi
"$PY" -m pip install -q -e ".[dev]"
# pyenv-managed Pythons reach new console scripts (infir-train, ...) through shims made by a rehash.
command -v infir-train >/dev/null || { command -v pyenv >/dev/null && pyenv rehash; } || true
command -v infir-train >/dev/null || echo "setup.sh: infir-train is not on PATH; add $("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))') to PATH" >&2
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=""
  command -v bwrap >/dev/null || missing="$missing bubblewrap"
  command -v chromium >/dev/null || missing="$missing chromium"
  if [ -n "$missing" ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing) >/dev/null \
      || echo "setup.sh: could not install$missing (the sandbox/browser tests will say what is missing)" >&2
  fi
fi
echo "infir is set up: $("$PY" -c 'import infir, torch; print("infir", infir.__version__, "| torch", torch.__version__)')"
