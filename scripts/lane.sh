#!/usr/bin/env bash
# A test lane other than ./test.sh's: make its venv once, then run pytest in it.
#   scripts/lane.sh latest [pytest args]   torch 2.15.0 as PyPI builds it (CUDA) and the newest
#                                          IPython, ipykernel, pandas, matplotlib, numpy
#   scripts/lane.sh floor [pytest args]    exactly the minimums pyproject.toml declares for torch,
#                                          ipython, ipywidgets, pandas and matplotlib
# Each venv (.venv/lane-NAME) sees no site-packages but its own and is kept with a stamp (what
# was asked for + a hash of pyproject's dependency lists): the first run downloads about 3 GB from PyPI
# (torch's CUDA build and its nvidia-* packages, 4-8 min), later runs only test.
# Packages come from PyPI alone: this machine's pip configuration caps torch and serves a local
# CPU wheel, which would hide the build and the releases a user's `pip install` gets.
set -euo pipefail
cd "$(dirname "$0")/.."
lane=${1:?usage: scripts/lane.sh latest|floor [pytest args]}
shift
python=${PYTHON:-python3}

case "$lane" in
    latest)
        wanted=(torch==2.15.0)
        ;;
    floor)
        mapfile -t wanted < <("$python" scripts/floors.py)
        # pandas 2.0's wheels are built against numpy 1.x: with numpy 2 it fails to import
        # ("numpy.dtype size changed"), so the floor lane takes the last numpy 1
        wanted+=("numpy<2")
        ;;
    *)
        echo "lane: $lane is not a lane; use latest or floor" >&2
        exit 2
        ;;
esac

venv=.venv/lane-$lane
stamp=$venv/.singlecard-nb-installed
want="${wanted[*]} $("$python" scripts/floors.py --stamp)"
# --no-cache-dir: the venv is kept, so a second copy of its ~3 GB of wheels in pip's cache would
# only double what the disk must hold (a CI run once ran out of it here, building both lanes)
pypi() {
    env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL -u PIP_CONSTRAINT \
        PIP_CONFIG_FILE=/dev/null "$venv/bin/python" -m pip install -q --no-cache-dir "$@"
}
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    began=$SECONDS
    # the venv and, while pip installs, the wheels it downloaded: measured in docs/support.md
    needed_gb=10
    mkdir -p .venv
    free_gb=$(df -P -BG .venv "${TMPDIR:-/tmp}" 2>/dev/null | awk 'NR > 1 {sub("G", "", $4); print $4}' | sort -n | head -1)
    if [ -n "$free_gb" ] && [ "$free_gb" -lt "$needed_gb" ]; then
        echo "lane $lane: making $venv needs about $needed_gb GB free on disk (the venv, and the wheels while pip installs them); .venv or ${TMPDIR:-/tmp} has $free_gb GB. Free some and run it again." >&2
        exit 1
    fi
    echo "lane $lane: making $venv with ${wanted[*]} from PyPI (about 3 GB, 4-8 min; once)" >&2
    rm -rf "$venv"
    "$python" -m venv "$venv"
    # torch first and alone: resolving it beside a dozen other packages costs minutes
    pypi "${wanted[0]}"
    pypi -e ".[dev]" "${wanted[@]}"
    "$venv/bin/python" -m ipykernel install --sys-prefix --name python3 >/dev/null
    echo "$want" > "$stamp"
    echo "lane $lane: ready after $((SECONDS - began)) s" >&2
fi
echo "lane $lane: pytest in $venv" >&2
exec "$venv/bin/python" -m pytest -n 2 --dist loadfile --no-loadscope-reorder -p no:cacheprovider "$@"
