#!/usr/bin/env bash
# Set up, then open JupyterLab on the quickstart notebook.
#   ./lab.sh              JupyterLab on notebooks/quickstart.ipynb: open the URL it prints
#                         (http://127.0.0.1:8888/lab/tree/quickstart.ipynb?token=...)
#   ./lab.sh --headless   execute the notebook in a real kernel and print a report
# Other arguments go to `jupyter lab` (e.g. --port=8890). Works as root too (containers, CI):
# then --allow-root is passed, which JupyterLab otherwise refuses to start without.
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
if [ "${1:-}" = "--headless" ]; then
    shift
    exec .venv/bin/python scripts/run_notebook.py notebooks/quickstart.ipynb "$@"
fi
as_root=()
if [ "$(id -u)" = 0 ]; then
    as_root=(--allow-root)
fi
if [ "${CI:-}" != true ] && [ -z "${SINGLECARD_NB_QUIET:-}" ]; then
    echo "lab: starting JupyterLab (about 5 s); open the URL it prints (it ends in" \
         "/lab/tree/quickstart.ipynb?token=...); Ctrl-C stops it" >&2
fi
# The notebooks folder is the file browser's root; the URL JupyterLab prints opens the
# quickstart (LabApp.default_url is the path of that printed URL; a plain /lab is the Launcher).
exec .venv/bin/jupyter lab --ip=127.0.0.1 --no-browser \
    --ServerApp.root_dir=notebooks --LabApp.default_url=/lab/tree/quickstart.ipynb \
    ${as_root[@]+"${as_root[@]}"} "$@"
