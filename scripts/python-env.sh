#!/usr/bin/env bash
# Makes (once) the virtual environment the Python tests run in, with PyTorch, transformers,
# nanobind, scikit-build-core and pytest from PyPI, and installs the dcp package into it from this
# checkout. Usage: scripts/python-env.sh VENV_DIR [pip install options for dcp...]
set -euo pipefail
venv=$1
shift
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import torch, transformers, nanobind, scikit_build_core, pytest" 2>/dev/null; then
  echo "python-env: installing torch, transformers, nanobind, scikit-build-core, pytest into $venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q torch transformers nanobind scikit-build-core pytest numpy ninja
fi
# Build against the torch of this environment (no build isolation).
"$venv/bin/pip" install -q --no-build-isolation "$@" "$(dirname "$0")/.."
