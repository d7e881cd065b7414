#!/usr/bin/env bash
# Create or refresh .venv for singlecard_nb. Reuses a torch that is already importable
# (the venv sees system site-packages); otherwise installs torch==2.13.0, whose CPU wheel lies
# on disk on the project's machines (a plain `torch` would download gigabytes).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv --system-site-packages .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/python -m pip install -q torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/python -c "import torch"
fi
stamp=.venv/.singlecard-nb-installed
wanted=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    .venv/bin/python -m pip install -q -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/python -c "import singlecard_nb, IPython, ipywidgets, nbclient, playwright"
    # the notebooks' kernel is this venv's python
    .venv/bin/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (singlecard_nb)" >/dev/null
    echo "$wanted" > "$stamp"
fi
