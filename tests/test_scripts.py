"""The README's two commands: `scripts/setup.sh` says what it does (quietly under CI=true), and
`./lab.sh` really serves JupyterLab, as root (containers, CI) and as a normal user.

Each real `./lab.sh` case starts `./lab.sh` on a free port, waits for `/api/status` to answer, then stops it
by its PID and kills whatever is left in its process group. The set-up it runs first must be
the quick path (the stamp in .venv): a suite that re-ran a minutes-long set-up per test would
be slow, so without a set-up .venv the test is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from singlecard_nb.job import free_port

ROOT = Path(__file__).resolve().parent.parent
STAMP = ROOT / ".venv" / ".singlecard-nb-installed"
TOKEN = "singlecard-lab-test"



def _stub(path: Path, script: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/usr/bin/env bash\n" + script)
    path.chmod(0o755)


@pytest.mark.parametrize("uid, allow_root", [("0", True), ("1000", False)])
def test_allow_root_only_as_root(tmp_path, uid, allow_root):
    """lab.sh's own logic, with set-up, jupyter and `id` stubbed: fast, and both branches run
    whoever runs the suite."""
    shutil.copy(ROOT / "lab.sh", tmp_path / "lab.sh")
    _stub(tmp_path / "scripts" / "setup.sh", "exit 0\n")
    _stub(tmp_path / ".venv" / "bin" / "jupyter", 'printf "%s\\n" "$@" > "$(dirname "$0")/args"\n')
    _stub(tmp_path / "fake-bin" / "id", f'[ "$1" = -u ] && echo {uid} || exec /usr/bin/id "$@"\n')
    env = {**os.environ, "PATH": f"{tmp_path / 'fake-bin'}:{os.environ['PATH']}"}
    done = subprocess.run([str(tmp_path / "lab.sh"), "--port=9999"], env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    args = (tmp_path / ".venv" / "bin" / "args").read_text().split()
    assert args[:3] == ["lab", "--ip=127.0.0.1", "--no-browser"]
    # the URL JupyterLab prints opens the quickstart, with the notebooks folder as the root
    assert "--ServerApp.root_dir=notebooks" in args
    assert "--LabApp.default_url=/lab/tree/quickstart.ipynb" in args
    assert ("--allow-root" in args) is allow_root and args[-1] == "--port=9999"


# A stand-in for python: `-m venv` makes a .venv whose python is this script, pip "installs"
# (torch leaves a marker so the find_spec check then finds it), everything else succeeds.
FAKE_PYTHON = """
here="$(cd "$(dirname "$0")" && pwd)"
echo "$*" >> "$CALLS"
case "$1" in
  --version) echo "Python 3.99.0";;
  -m) case "$2" in
        venv) mkdir -p "${@: -1}/bin" && cp "$0" "${@: -1}/bin/python";;
        pip) if [[ "$*" == *torch==2.13.0* ]]; then touch "$here/torch-installed"; fi;;
      esac;;
  -c) if [[ "$2" == *find_spec* ]]; then [ -e "$here/torch-installed" ]; exit; fi;;
esac
"""


@pytest.fixture
def checkout(tmp_path):
    """A copy of setup.sh and pyproject.toml with a stand-in python (fast, no pip, no network)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    _stub(tmp_path / "fake-bin" / "python3", FAKE_PYTHON)
    return tmp_path


def _setup(checkout: Path, **env: str) -> tuple[str, list[str]]:
    calls = checkout / "calls"
    calls.write_text("")
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", "SINGLECARD_NB_QUIET")}
    environ.update(PYTHON=str(checkout / "fake-bin" / "python3"), CALLS=str(calls), **env)
    done = subprocess.run([str(checkout / "scripts" / "setup.sh")], env=environ,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # progress goes to stderr: stdout stays for what callers print
    return done.stderr, calls.read_text().splitlines()


def test_first_setup_says_what_it_is_doing_and_later_ones_are_silent(checkout):
    said, calls = _setup(checkout)
    steps = [re.sub(r"\d+ s;", "N s;", line) for line in said.splitlines()
             if not line.startswith("setup:   done in")]
    assert [line.split(" (")[0] for line in steps] == [
        "setup: 1/4 creating .venv with Python 3.99.0",
        "setup: 2/4 installing torch==2.13.0 into .venv",
        "setup: 3/4 installing singlecard_nb and its dev extra",
        "setup: 4/4 registering the Jupyter kernel 'Python 3",
        "setup: .venv is ready after N s; later runs skip these steps",
    ]
    assert said.count("setup:   done in") == 4
    for estimate in ("a few seconds", "about 30-60 s from a local wheel", "about 2-6 min",
                     "a second or two", "lightning, transformers, accelerate"):
        assert estimate in said
    assert any("pip install -q torch==2.13.0" in c for c in calls)

    said, calls = _setup(checkout)  # the stamp says nothing changed
    assert said == "" and not any("pip" in c for c in calls)

    pyproject = checkout / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "\n# a new dependency\n")
    said, calls = _setup(checkout)
    assert "3/4 installing singlecard_nb" in said and "1/4" not in said and "2/4" not in said


def test_the_venv_resolves_like_a_users_and_an_old_one_that_saw_the_machines_packages_goes(checkout):
    said, calls = _setup(checkout)
    made = [c for c in calls if c.startswith("-m venv")]
    assert made == ["-m venv .venv"]  # no --system-site-packages: the machine's old IPython stays out

    (checkout / ".venv" / "pyvenv.cfg").write_text("include-system-site-packages = true\n")
    said, calls = _setup(checkout)  # a .venv made by the old setup.sh is made anew
    assert "removing the old .venv, which saw the machine's site-packages" in said
    assert "-m venv .venv" in calls and any("torch==2.13.0" in c for c in calls)


@pytest.mark.parametrize("quiet", [{"CI": "true"}, {"SINGLECARD_NB_QUIET": "1"}])
def test_setup_is_quiet_for_ci_logs(checkout, quiet):
    said, calls = _setup(checkout, **quiet)
    assert said == ""
    assert (checkout / ".venv" / ".singlecard-nb-installed").exists()  # and still did its work


def _status(port: int) -> dict | None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/status",
                                     headers={"Authorization": f"token {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return json.loads(response.read())
    except OSError:
        return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def home():
    """A HOME and Jupyter directories of its own, writable by any user (the `nobody` case)."""
    path = Path(tempfile.mkdtemp(prefix="singlecard-lab-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _runs_as(user: str) -> None:
    """Skip unless this test process is `user` ("root" or "normal user")."""
    root = os.geteuid() == 0
    if user == "root" and not root:
        pytest.skip("the root case needs root (CI runs ./test.sh as root)")
    if user == "normal user" and root:
        # This .venv belongs to root (its python may sit under /root), so another user cannot
        # run it; the non-root branch of lab.sh is checked by test_allow_root_only_as_root.
        pytest.skip("running as root: the normal-user case runs when a normal user runs the suite")


@pytest.mark.slow
@pytest.mark.parametrize("user", ["root", "normal user"])
def test_lab_sh_serves_jupyterlab(user, home):
    if STAMP.exists() is False:
        pytest.skip("no set-up .venv here (run scripts/setup.sh once, or ./test.sh); starting "
                    "./lab.sh would run the whole minutes-long set-up inside this test")
    _runs_as(user)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "CUDA_"))}
    env.update(HOME=str(home), JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_DATA_DIR=str(home / "data"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               IPYTHONDIR=str(home / "ipython"))
    env.pop("CI", None)  # the progress messages are part of what is checked
    env.pop("SINGLECARD_NB_QUIET", None)
    log_path = home / "lab.log"
    with open(log_path, "w") as log:
        lab = subprocess.Popen(
            [str(ROOT / "lab.sh"), f"--port={port}", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={TOKEN}"],
            cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        status, deadline = None, time.monotonic() + 90
        while status is None and time.monotonic() < deadline and lab.poll() is None:
            time.sleep(0.3)
            status = _status(port)
        output = log_path.read_text()
        assert status is not None, f"./lab.sh ({user}) never answered /api/status:\n{output}"
        assert "started" in status and "kernels" in status
        assert "Running as root is not recommended" not in output
        assert "setup:" not in output, "lab.sh re-ran the slow set-up:\n" + output
        assert "lab: starting JupyterLab" in output
        # the URL it prints opens the quickstart notebook, not the Launcher
        printed = re.search(r"http://127\.0\.0\.1:\d+/\S+", output)
        assert printed, output
        url = printed.group(0)
        # JupyterLab prints a token it was given as "...": the user has it already
        assert "/lab/tree/quickstart.ipynb?token=" in url, output
        url = url.split("?token=")[0] + f"?token={TOKEN}"
        with urllib.request.urlopen(url, timeout=10) as page:
            config = re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>',
                               page.read().decode(), re.S)
        assert config and json.loads(config.group(1))["treePath"] == "quickstart.ipynb"
    finally:
        lab.send_signal(signal.SIGTERM)  # by its PID: JupyterLab shuts down cleanly
        try:
            lab.wait(timeout=20)
        finally:
            if _group_alive(lab.pid):  # anything it started that outlived it
                os.killpg(lab.pid, signal.SIGKILL)
    assert lab.returncode is not None and not _group_alive(lab.pid)
    assert _status(port) is None
