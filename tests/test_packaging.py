"""What a user installs works: the wheel in a fresh venv, and an sdist that carries its tests.

Offline and without new downloads: the wheel is built with the setuptools already installed
(`pip wheel --no-build-isolation`), and the fresh venv reaches this environment's packages
(torch, IPython, ...) through a `.pth` line, so pip finds every dependency already satisfied.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                              ".pytest_cache", ".ruff_cache", "test-artifacts",
                              ".ipynb_checkpoints")

pytestmark = pytest.mark.slow


def _run(*cmd: str | Path, cwd: Path, timeout: float = 300) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of the checkout, so that building leaves no build/ or egg-info behind here."""
    src = tmp_path_factory.mktemp("src") / "singlecard_nb"
    shutil.copytree(ROOT, src, ignore=SKIP)
    return src


@pytest.fixture(scope="module")
def wheel(source, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run(sys.executable, "-m", "pip", "wheel", source, "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", out, cwd=out)
    (built,) = out.glob("singlecard_nb-*.whl")
    return built


def test_the_wheel_holds_the_package_its_c_sources_and_the_license(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("singlecard_nb/__init__.py", "singlecard_nb/py.typed",
                   "singlecard_nb/inspection/kernel/onepass.c",
                   "singlecard_nb/inspection/kernel/onepass_module.c"):
        assert needed in names, needed
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert not any(n.startswith("tests/") for n in names)
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    metadata = zipfile.ZipFile(wheel).read(meta).decode()
    assert "License-Expression: MIT" in metadata
    assert "Classifier: Framework :: Jupyter" in metadata and "Keywords: " in metadata
    assert "Requires-Dist: torch>=2.6" in metadata


def test_the_installed_wheel_loads_inspects_and_builds_its_kernel(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                     cwd=tmp_path).strip())
    # this environment's packages (its own and those it sees from the system), after the
    # venv's own: torch is reused, nothing is downloaded
    here = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    (site / "this_environment.pth").write_text("\n".join(here) + "\n")
    _run(python, "-m", "pip", "install", "--no-index", "-q", wheel, cwd=tmp_path)
    script = textwrap.dedent("""
        import json
        from IPython.core.interactiveshell import InteractiveShell

        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "singlecard_nb")
        result = ip.run_cell('''
        import torch
        import singlecard_nb as scn
        from singlecard_nb.inspection.kernel import native

        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        with scn.inspect(model) as insp:
            model(torch.randn(3, 4))
        built = native.wait(120)
        ''')
        ns = ip.user_ns
        print(json.dumps({
            "error": repr(result.error_in_exec),
            "file": ns["scn"].__file__,
            "rows": len(ns["insp"].frame()),
            "modules": sorted(set(ns["insp"].frame()["module"])),
            "kernel": ns["native"].status(),
            "kernels": len(ns["native"].kernels()),
        }))
    """)
    out = json.loads(_run(python, "-c", script, cwd=tmp_path).strip().splitlines()[-1])
    assert out["error"] == "None", out
    assert out["file"].startswith(str(site)), out  # the installed copy, not the checkout
    assert out["rows"] > 0 and out["modules"] == ["", "0", "1", "2"], out
    # built from the .c files the wheel installed
    assert out["kernels"] > 0 and out["kernel"].startswith("one-pass kernel for "), out


def test_the_sdist_carries_what_its_tests_need(source, tmp_path):
    script = "from setuptools import build_meta; print(build_meta.build_sdist({!r}))"
    name = _run(sys.executable, "-c", script.format(str(tmp_path)), cwd=source).strip()
    name = name.splitlines()[-1]
    with tarfile.open(tmp_path / name) as sdist:
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python 3.11.4+
        sdist.extractall(tmp_path, **safe)
    unpacked = tmp_path / name.removesuffix(".tar.gz")
    # Every file of the package and of what its tests read (helpers, machine descriptions, the
    # notebooks and scripts they execute, the benchmarks they smoke-test), byte for byte: the
    # suite then collects and runs there as here. (Collecting it, which imports every test
    # module and Lightning and transformers with them, cost 40-100 s of a loaded run.)
    missing, changed = [], []
    for folder in ("singlecard_nb", "tests", "notebooks", "scripts", "benchmarks", "docs", ".ci"):
        for path in sorted((source / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                copy = unpacked / path.relative_to(source)
                if not copy.is_file():
                    missing.append(str(path.relative_to(source)))
                elif copy.read_bytes() != path.read_bytes():
                    changed.append(str(path.relative_to(source)))
    assert missing == [] and changed == [], (missing, changed)
    for needed in ("LICENSE", "README.md", "pyproject.toml", "test.sh", "lab.sh",
                   "tests/conftest.py", "tests/machines/four_gpus.json",
                   "notebooks/quickstart.ipynb", "singlecard_nb/inspection/kernel/onepass.c"):
        assert (unpacked / needed).is_file(), needed  # and the folders above were not empty
