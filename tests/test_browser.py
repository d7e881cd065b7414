"""The quickstart in JupyterLab, driven like a user in headless Chromium (offline).

Runs all cells from the page, then: the picker lists the described machine's 4 GPUs; choosing
GPU 2 and pressing *Pin* changes the kernel's CUDA_VISIBLE_DEVICES to GPU 2's UUID (read back
from a re-run cell); the live inspection view rendered its module rows. Screenshots go to
test-artifacts/browser/ for a person to look at.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from browser_dark import check_dark_theme
from conftest import notebook_runner

ROOT = Path(__file__).resolve().parent.parent
MACHINE = Path(__file__).with_name("browser_machine.json")
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]
# Keep the page quiet and every cell in the DOM: no news toast, no windowed notebook.
LAB_OVERRIDES = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false",
                                                     "checkForUpdates": False},
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
}

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _kernel_environment(*args, **kwargs):
    return notebook_runner().kernel_environment(*args, **kwargs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_server(url: str, process: subprocess.Popen, log: Path, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {process.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"JupyterLab did not answer {url} in {seconds} s:\n{log.read_text()}")


@pytest.fixture
def lab(tmp_path):
    """JupyterLab on 127.0.0.1 serving a fresh copy of notebooks/; yields its base URL."""
    root = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", root)
    settings = tmp_path / "app-settings"
    settings.mkdir()
    (settings / "overrides.json").write_text(json.dumps(LAB_OVERRIDES))
    env = _kernel_environment(str(tmp_path / "jupyter-path"), machine=str(MACHINE))
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    port = _free_port()
    log = tmp_path / "jupyterlab.log"
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
        f"--port={port}", "--ServerApp.port_retries=0", "--ServerApp.token=",
        "--ServerApp.password=", f"--ServerApp.root_dir={root}",
        f"--LabApp.app_settings_dir={settings}",
        f"--LabApp.user_settings_dir={tmp_path / 'user-settings'}",
        f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
    ]
    with open(log, "w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_for_server(f"{url}/api/status", process, log)
        yield url
    finally:
        # Its own session: the kernels it started go with it.
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, ARTIFACTS / "jupyterlab.log")


def _only_local(route) -> None:
    if re.match(r"^(https?|wss?)://127\.0\.0\.1[:/]", route.request.url):
        route.continue_()
    else:
        route.abort()


def test_quickstart_in_a_real_browser(lab):
    from playwright.sync_api import expect, sync_playwright

    started = time.monotonic()
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    machine = json.loads(MACHINE.read_text())
    gpu2 = machine["gpus"][2]
    gpu2_label = f"GPU 2 · {gpu2['name']} · {gpu2['uuid'][:12]}"

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.route("**/*", _only_local)
            page = context.new_page()
            page.goto(f"{lab}/lab/tree/quickstart.ipynb")
            idle = page.locator(".jp-StatusBar-Widget", has_text="| Idle")
            expect(idle.first).to_be_visible(timeout=30_000)

            page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
            page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()
            last_output = page.locator(".jp-OutputArea-output", has_text="CUDA_VISIBLE_DEVICES =")
            expect(last_output).to_be_visible(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "1-after-run-all.png"))

            # The picker lists the described machine, one row per GPU.
            picker = page.locator(".singlecard-picker")
            expect(picker).to_have_count(1)
            expect(picker.locator("tr.singlecard-gpu")).to_have_count(4)
            expect(picker.locator("tr.singlecard-mig")).to_have_count(2)
            picker.scroll_into_view_if_needed()
            picker.screenshot(path=str(ARTIFACTS / "2-picker.png"))

            # Choose GPU 2 and press Pin, as a user would.
            picker.locator(".widget-dropdown select").select_option(label=gpu2_label)
            picker.locator("button.jupyter-button", has_text=re.compile(r"^\s*Pin\s*$")).click()
            expect(picker).to_contain_text("Pinned (hard): GPU 2", timeout=15_000)
            expect(picker.locator("tr.singlecard-gpu").nth(2)).to_contain_text("pinned")
            picker.screenshot(path=str(ARTIFACTS / "3-picker-after-pin.png"))

            # The kernel itself now has GPU 2's UUID: re-run the last cell and read its output.
            last_cell = page.locator(".jp-CodeCell").last
            prompt = last_cell.locator(".jp-InputPrompt")
            before = prompt.inner_text()
            prompt.click()
            page.keyboard.press("Control+Enter")
            expect(prompt).not_to_have_text(before, timeout=15_000)
            expect(last_cell.locator(".jp-OutputArea-output")).to_contain_text(
                f"CUDA_VISIBLE_DEVICES = {gpu2['uuid']}", timeout=15_000)
            last_cell.screenshot(path=str(ARTIFACTS / "4-kernel-env.png"))

            # The live inspection view rendered one row per module, and its final state.
            live = page.locator("table.singlecard-live")
            expect(live).to_have_count(1)
            expect(live.locator("tr.singlecard-live-row")).to_have_count(6)
            live_output = page.locator(".jp-OutputArea-output", has=live)
            expect(live_output).to_contain_text("stopped")
            live_output.scroll_into_view_if_needed()
            live_output.screenshot(path=str(ARTIFACTS / "5-live-view.png"))
            figure = page.locator(".jp-OutputArea-output img").first
            figure.scroll_into_view_if_needed()
            figure.screenshot(path=str(ARTIFACTS / "6-heatmap.png"))

            check_dark_theme(page, ARTIFACTS)  # the same page, switched to JupyterLab Dark
        finally:
            browser.close()
    assert time.monotonic() - started < 105
