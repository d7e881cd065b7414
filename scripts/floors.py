"""Print `name==minimum` for each dependency whose floor the floor lane tests, read from
pyproject.toml (the one place the minimums are declared), one a line, torch first.
`--stamp` prints instead a hash of what a lane installs from pyproject.toml (its dependencies
and extras): a lane's venv is made again when that changes, not for any edit of the file."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import tomllib

TESTED = ("torch", "ipython", "ipywidgets", "pandas", "matplotlib")
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def floors(pyproject: Path = PYPROJECT) -> dict[str, str]:
    declared = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    found: dict[str, str] = {}
    for requirement in declared:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)", requirement.strip())
        if match and match[1].lower() in TESTED:
            found[match[1].lower()] = match[2]
    missing = [name for name in TESTED if name not in found]
    if missing:
        sys.exit(f"floors: pyproject.toml declares no `>=` minimum for {', '.join(missing)}")
    return {name: found[name] for name in TESTED}


def stamp(pyproject: Path = PYPROJECT) -> str:
    project = tomllib.loads(pyproject.read_text())["project"]
    installed = [project["dependencies"], project.get("optional-dependencies", {})]
    return hashlib.sha256(json.dumps(installed, sort_keys=True).encode()).hexdigest()


if __name__ == "__main__":
    if sys.argv[1:] == ["--stamp"]:
        print(stamp())
    else:
        print("\n".join(f"{name}=={version}" for name, version in floors().items()))
