#!/usr/bin/env bash
# Set up (venv, packages, Debian's Chromium for the browser test), then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null
    else
        echo "note: chromium is not installed and this is not root: the browser test will be skipped" >&2
    fi
fi
.venv/bin/ruff check singlecard_nb tests benchmarks scripts
exec .venv/bin/python -m pytest "$@"
