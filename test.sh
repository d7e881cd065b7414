#!/usr/bin/env bash
# Set up (venv, packages, Debian's Chromium for the browser test), then run the whole suite.
# Says what it is doing on stderr; CI=true (or SINGLECARD_NB_QUIET=1) keeps CI logs quiet.
set -euo pipefail
cd "$(dirname "$0")"
say() {
    if [ "${CI:-}" != true ] && [ -z "${SINGLECARD_NB_QUIET:-}" ]; then
        printf 'test: %s\n' "$*" >&2
    fi
}
scripts/setup.sh
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        say "installing Debian's chromium for the browser test (apt-get, about 1-2 min; once)"
        began=$SECONDS
        apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null
        say "  done in $((SECONDS - began)) s"
    else
        echo "note: chromium is not installed and this is not root: the browser test will be skipped" >&2
    fi
fi
say "ruff check (a few seconds)"
.venv/bin/ruff check singlecard_nb tests benchmarks scripts
say "pytest (the whole suite: about 1 300 tests in two workers, 7-10 min on 2 cores, more when loaded; a dot per" \
    "test as it ends and the 15 slowest at the end; ./test.sh -k NAME runs a part, ./test.sh -n 0" \
    "in one process)"
# The tests that depend on how torch was built (marker torch_build) run here against this
# .venv's torch; .ci/run's latest lane runs them against PyPI's CUDA build of torch 2.15.0.
# Two workers, a test file each (pytest-xdist), in collection order (--no-loadscope-reorder):
# tests/conftest.py puts the longest files first, so the run does not end on one of them alone.
exec .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=15 "$@"
