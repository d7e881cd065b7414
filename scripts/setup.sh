#!/usr/bin/env bash
# Create or refresh .venv for singlecard_nb, resolved as a user's `pip install -e '.[dev]'`
# resolves today: the venv does not see the machine's site-packages (an old system IPython
# would otherwise hide what users get). torch is pinned to 2.13.0 (the main lane): on the
# project's machines its CPU-only wheel lies on disk, elsewhere pip downloads the CUDA build
# from PyPI (about 3 GB; a 4.6 GB .venv). .ci/run's other lanes test the newest releases and
# pyproject's floors.
#
# The first run takes 2-9 minutes (measured on a busy 2-core box: 1 min 42 s as root with the
# local CPU wheel; 8 min 30 s as a normal user downloading the CUDA build) and says what it is
# doing, step by step, on stderr; later runs find the stamp
# (.venv/.singlecard-nb-installed, the hash of pyproject.toml) and print nothing.
# CI=true or SINGLECARD_NB_QUIET=1 keeps CI logs to errors only.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}

started=$SECONDS
quiet=false
if [ "${CI:-}" = true ] || [ -n "${SINGLECARD_NB_QUIET:-}" ]; then
    quiet=true
fi
step_began=$SECONDS
step() {  # step "what is happening (how long it usually takes)"
    step_began=$SECONDS
    $quiet || printf 'setup: %s\n' "$*" >&2
}
step_done() {
    $quiet || printf 'setup:   done in %d s\n' "$((SECONDS - step_began))" >&2
}
pip_quietly() {  # pip's own output is a wall of text; keep only what is not a location warning
    .venv/bin/python -m pip install -q "$@" 2>&1 | grep -v "^WARNING: Location" || true
}

if grep -qs "include-system-site-packages = true" .venv/pyvenv.cfg; then
    # made by an older setup.sh, which let the machine's packages (an old IPython) stand in
    step "0/4 removing the old .venv, which saw the machine's site-packages (a few seconds)"
    rm -rf .venv
    step_done
fi
if [ ! -x .venv/bin/python ]; then
    step "1/4 creating .venv with $("$python" --version 2>&1) (a few seconds; first run only)"
    "$python" -m venv .venv
    step_done
fi
# find_spec, not import: asking costs 50 ms where importing torch costs seconds on every ./lab.sh
if ! .venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)"; then
    step "2/4 installing torch==2.13.0 into .venv (about 30-60 s from a local wheel, about" \
         "3 min when pip downloads the CUDA build; first run only)"
    pip_quietly torch==2.13.0
    .venv/bin/python -c "import torch"
    step_done
fi
stamp=.venv/.singlecard-nb-installed
wanted=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    step "3/4 installing singlecard_nb and its dev extra (JupyterLab, nbclient, playwright," \
         "pytest, ruff, lightning, transformers, accelerate, torchinfo, torchlens) into .venv" \
         "(about 2-6 min; again only when pyproject.toml changes)"
    pip_quietly -e ".[dev]"
    .venv/bin/python -c "import singlecard_nb, IPython, ipywidgets, nbclient, playwright"
    step_done
    step "4/4 registering the Jupyter kernel 'Python 3 (singlecard_nb)' in .venv (a second or two)"
    # the notebooks' kernel is this venv's python
    .venv/bin/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (singlecard_nb)" >/dev/null
    echo "$wanted" > "$stamp"
    step_done
    $quiet || printf 'setup: .venv is ready after %d s; later runs skip these steps\n' \
        "$((SECONDS - started))" >&2
fi
