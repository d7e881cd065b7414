"""The quickstart in JupyterLab, driven like a user in headless Chromium (offline).

Runs all cells from the page, then: the picker lists the described machine's 4 GPUs; choosing
GPU 2 and pressing *Pin* changes the kernel's CUDA_VISIBLE_DEVICES to GPU 2's UUID (read back
from a re-run cell); the live inspection view rendered its module rows. Screenshots go to
test-artifacts/browser/ for a person to look at.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from browser_dark import check_dark_theme, switch_theme
from conftest import notebook_runner

from singlecard_nb.job import free_port

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


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    """JupyterLab on 127.0.0.1 serving a fresh copy of notebooks/, started once for this file's
    tests; yields (base URL, the folder it serves)."""
    tmp_path = tmp_path_factory.mktemp("lab")
    root = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", root)
    settings = tmp_path / "app-settings"
    settings.mkdir()
    (settings / "overrides.json").write_text(json.dumps(LAB_OVERRIDES))
    env = _kernel_environment(str(tmp_path / "jupyter-path"), machine=str(MACHINE))
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    port = free_port()
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
        yield url, root
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


@pytest.fixture
def lab(lab_server):
    return lab_server[0]


def _only_local(route) -> None:
    if re.match(r"^(https?|wss?)://127\.0\.0\.1[:/]", route.request.url):
        route.continue_()
    else:
        route.abort()


@contextlib.contextmanager
def lab_page(address: str):
    """A Chromium page (1400 × 1000, local requests only) open at `address`, closed after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.route("**/*", _only_local)
            page = context.new_page()
            page.goto(address)
            yield page
        finally:
            browser.close()


def test_quickstart_in_a_real_browser(lab):
    from playwright.sync_api import expect

    started = time.monotonic()
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    machine = json.loads(MACHINE.read_text())
    gpu2 = machine["gpus"][2]
    gpu2_label = f"GPU 2 · {gpu2['name']} · {gpu2['uuid'][:12]}"

    with lab_page(f"{lab}/lab/tree/quickstart.ipynb") as page:
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
        expect(live.locator("tr.singlecard-live-row")).to_have_count(5)  # root folded into "4"
        live_output = page.locator(".jp-OutputArea-output", has=live)
        expect(live_output).to_contain_text("stopped")
        live_output.scroll_into_view_if_needed()
        live_output.screenshot(path=str(ARTIFACTS / "5-live-view.png"))
        figure = page.locator(".jp-OutputArea-output img").first
        figure.scroll_into_view_if_needed()
        figure.screenshot(path=str(ARTIFACTS / "6-heatmap.png"))

        check_dark_theme(page, ARTIFACTS)  # the same page, switched to JupyterLab Dark
    assert time.monotonic() - started < 105


# --- the live view while a cell trains ------------------------------------------------------

TRAINING_NOTEBOOK = {
    "cells": [
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
         "source": "import os, time, torch\nimport singlecard_nb as scn\n"
                   "from gpt_like import GPT\n"
                   "torch.set_num_threads(1); torch.manual_seed(0)\n"
                   "model = GPT(n_layer=12)\ninsp = scn.inspect(model)\ninsp.live()"},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
         # h.9.mlp.c_fc grows 5 % a step until the test writes `stop`
         "source": "fc = model.transformer.h[9].mlp.c_fc\nwith insp:\n"
                   "    for step in range(2000):\n"
                   "        with torch.no_grad():\n            fc.weight.mul_(1.05)\n"
                   "        model(torch.randint(0, 64, (2, 8)))\n        time.sleep(0.02)\n"
                   "        if os.path.exists('stop'):\n            break"},
    ],
    "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python",
                                "name": "python3"}},
    "nbformat": 4, "nbformat_minor": 5,
}


def _rows(view) -> list[str]:
    return view.locator("tbody tr.singlecard-live-row").all_inner_texts()


def _screenshot(view, path: Path) -> None:
    """A screenshot of the view, which the kernel may redraw (a new element) while it is
    taken: then once more."""
    from playwright.sync_api import Error

    for attempt in range(3):
        try:
            view.screenshot(path=str(path))
            return
        except Error:
            if attempt == 2:
                raise


def _next_update(page, view) -> None:
    """Wait until the kernel redraws the view (its "updated" time or step changes)."""
    from playwright.sync_api import expect

    head = view.locator(".scn-head").inner_text()
    # 20 s: the view redraws at most 4 times a second, and less often while drawing costs the
    # kernel more than 4 % of its time
    expect(page.locator(".singlecard-live-view .scn-head").first).not_to_have_text(
        head, timeout=20_000)


def test_live_view_searches_sorts_and_pins_in_the_browser_while_a_cell_trains(lab_server):
    """Kernel busy: every interaction happens in the page, and survives the view's updates."""
    from playwright.sync_api import expect

    url, root = lab_server
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (root / "training.ipynb").write_text(json.dumps(TRAINING_NOTEBOOK))
    shutil.copy(Path(__file__).with_name("gpt_like.py"), root / "gpt_like.py")
    # a workspace of its own: the quickstart's tabs, open in the default one, stay shut
    with lab_page(f"{url}/lab/workspaces/live/tree/training.ipynb") as page:
        expect(page.locator(".jp-StatusBar-Widget", has_text="| Idle").first).to_be_visible(
            timeout=30_000)
        switch_theme(page, "JupyterLab Light")  # the quickstart's test left it dark
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()
        view = page.locator(".singlecard-live-view")
        expect(view).to_contain_text("recording", timeout=60_000)
        expect(page.locator(".jp-StatusBar-Widget", has_text="| Busy").first).to_be_visible()
        # the ranking puts the growing layer's group first, named by its worst member
        expect(view.locator("tbody tr").first).to_contain_text(
            "worst: transformer.h.9.mlp.", timeout=20_000)
        cells = page.locator(".jp-Cell").count()

        # a group opens into its 12 members, and stays open across an update
        group = view.locator("tbody tr").first.get_attribute("data-key")
        toggle = f"tr[data-key='{group}'] .scn-toggle"  # rows may move between updates
        view.locator(toggle).click()
        expect(view.locator("tr.scn-member")).to_have_count(12)
        _next_update(page, view)
        expect(view.locator("tr.scn-member")).to_have_count(12)
        view.locator(toggle).click()
        expect(view.locator("tr.scn-member")).to_have_count(0)

        # search (a glob), typed while the cell runs; it survives the next update
        search = view.locator("input.scn-search")
        search.click()
        page.keyboard.type("*ln_1")  # keys go to the box, not to notebook shortcuts
        expect(view.locator("tbody tr.singlecard-live-row")).to_have_count(12)
        _next_update(page, view)
        expect(view.locator("input.scn-search")).to_have_value("*ln_1")
        assert all("ln_1" in row for row in _rows(view)) and len(_rows(view)) == 12
        assert page.locator(".jp-Cell").count() == cells

        # sort by absmax (largest first), then pin a row: both survive an update
        view.locator("input.scn-search").fill("")
        view.locator("th", has_text=re.compile(r"^absmax$")).click()
        _next_update(page, view)
        expect(view.locator("th", has_text="absmax ▼")).to_have_count(1)
        values = view.locator("tbody tr.singlecard-live-row td:nth-child(7)").all_inner_texts()
        numbers = [float(v) for v in values]
        assert numbers == sorted(numbers, reverse=True)
        view.locator("tbody tr.singlecard-live-row", has_text="transformer.ln_f").locator(
            "td.p").click()
        _next_update(page, view)
        expect(view.locator("tbody tr").first).to_contain_text("transformer.ln_f")
        expect(view.locator("tbody tr").first.locator("td.p")).to_have_text("★")
        view.locator("input.scn-search").fill("")  # the whole ranked view (docs/live-view*.png are these, copied)
        _screenshot(view, ARTIFACTS / "live-view.png")

        switch_theme(page, "JupyterLab Dark")
        _next_update(page, view)
        _screenshot(view, ARTIFACTS / "live-view-dark.png")

        (root / "stop").write_text("")
        expect(view).to_contain_text("stopped", timeout=20_000)
