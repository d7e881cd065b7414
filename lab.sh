#!/usr/bin/env bash
# Set up, then open JupyterLab on the quickstart notebook.
#   ./lab.sh              JupyterLab on notebooks/quickstart.ipynb (http://127.0.0.1:8888)
#   ./lab.sh --headless   execute the notebook in a real kernel and print a report
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
if [ "${1:-}" = "--headless" ]; then
    shift
    exec .venv/bin/python scripts/run_notebook.py notebooks/quickstart.ipynb "$@"
fi
exec .venv/bin/jupyter lab notebooks/quickstart.ipynb --ip=127.0.0.1 --no-browser "$@"
