#!/usr/bin/env bash
# Create .venv (if missing) and install labsupport with its test and lab extras into it
# (JupyterLab is an extra: the core dependencies are what Colab installs).
#
# torch: a torch that is already importable in the venv is kept. Otherwise
# TORCH_SPEC is installed first (default torch==2.13.0: on the course's build
# machines pip finds its CPU build on local disk; elsewhere pip takes the build
# PyPI serves for the platform). On Colab, skip this script: the notebooks'
# first cell installs labsupport and keeps Colab's own torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
. "$VENV/bin/activate"
# pip 24.1+ reports download progress that labsupport shows when it fetches the embedded model
python -m pip install --disable-pip-version-check -q "pip>=24.1"
if ! python -c "import torch" 2>/dev/null; then
  python -m pip install --disable-pip-version-check -q "$TORCH_SPEC"
fi
python -m pip install --disable-pip-version-check -q -e ".[test,lab]"
python -c "import torch, labsupport; print('installed labsupport with torch', torch.__version__)"
