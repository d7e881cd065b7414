"""The picker, status and compare outputs in JupyterLab's dark theme, in headless Chromium
(offline; the same JupyterLab fixture as test_browser).

Measured in the page, as a person would see it: the contrast of text on its (composited)
background, no `$` typeset by MathJax, the status table inside its panel. Screenshots go to
test-artifacts/browser/dark-*.png.
"""

from __future__ import annotations

import json
import re
import time

import nbformat
import pytest
from test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_FLAGS, MACHINE, _only_local, lab  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.slow]

GPU2 = json.loads(MACHINE.read_text())["gpus"][2]["uuid"]
CELLS = [
    "%load_ext singlecard_nb\nimport singlecard_nb as scn",
    "%singlecard picker",
    f"%singlecard {GPU2}",
    "scn.status()",
    "import torch\nfrom torch import nn\n\n"
    "def run(scale):\n"
    "    torch.manual_seed(0)\n"
    "    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))\n"
    "    with torch.no_grad():\n"
    "        model[2].weight.mul_(scale)\n"
    "    with scn.inspect(model) as insp:\n"
    "        model(torch.randn(4, 8, generator=torch.Generator().manual_seed(1)))\n"
    "    return insp\n\n"
    "scn.compare(run(1.0), run(1.1))",
]

# The WCAG contrast of an element's text on what is behind it: translucent backgrounds are
# composited over the ancestors' down to the first opaque one (the theme's).
CONTRAST = """element => {
  const parse = c => { const m = c.match(/[\\d.]+/g).map(Number);
                       return [m[0], m[1], m[2], m.length > 3 ? m[3] : 1]; };
  const layers = [];
  for (let e = element; e; e = e.parentElement) {
    const bg = parse(getComputedStyle(e).backgroundColor);
    if (bg[3] > 0) layers.push(bg);
    if (bg[3] >= 1) break;
  }
  let base = [255, 255, 255];
  for (const [r, g, b, a] of layers.reverse())
    base = [r * a + base[0] * (1 - a), g * a + base[1] * (1 - a), b * a + base[2] * (1 - a)];
  const fg = parse(getComputedStyle(element).color);
  const text = [0, 1, 2].map(i => fg[i] * fg[3] + base[i] * (1 - fg[3]));
  const lum = c => { const [r, g, b] = c.map(v => { v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const [hi, lo] = [lum(text), lum(base)].sort((x, y) => y - x);
  return (hi + 0.05) / (lo + 0.05);
}"""


@pytest.fixture
def dark(tmp_path):
    """JupyterLab's dark theme as the user's setting (read when the `lab` fixture starts)."""
    themes = tmp_path / "user-settings" / "@jupyterlab" / "apputils-extension"
    themes.mkdir(parents=True)
    (themes / "themes.jupyterlab-settings").write_text(json.dumps({"theme": "JupyterLab Dark"}))


def test_picker_status_and_compare_read_in_the_dark_theme(dark, lab, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    started = time.monotonic()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python",
                                 "name": "python3"}
    nbformat.write(nb, str(tmp_path / "notebooks" / "dark.ipynb"))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(viewport={"width": 1200, "height": 1600})
            context.route("**/*", _only_local)
            page = context.new_page()
            page.goto(f"{lab}/lab/tree/dark.ipynb")
            expect(page.locator(".jp-StatusBar-Widget", has_text="| Idle").first).to_be_visible(
                timeout=30_000)
            assert page.locator("body").get_attribute("data-jp-theme-light") == "false"
            page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
            page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()
            compare = page.locator(".singlecard-compare")
            expect(compare).to_be_visible(timeout=60_000)

            picker = page.locator(".singlecard-picker")
            pinned = picker.locator("tr.singlecard-gpu", has_text="pinned")
            expect(pinned).to_have_count(1)
            picker.scroll_into_view_if_needed()
            picker.screenshot(path=str(ARTIFACTS / "dark-picker.png"))
            # the pinned row: its name cell (the theme's text on a green tint) and its mark
            assert pinned.locator("td").nth(1).evaluate(CONTRAST) >= 4.5
            assert pinned.locator("b", has_text="pinned").evaluate(CONTRAST) >= 3
            for line in picker.locator("div[style*='color']").all():  # status and notes
                assert line.evaluate(CONTRAST) >= 4.5, line.inner_text()

            status = page.locator(".jp-OutputArea-output", has=page.locator(".singlecard-status"))
            expect(status).to_contain_text("$CUDA_VISIBLE_DEVICES")  # shown as written
            assert status.locator("mjx-container, .MathJax").count() == 0  # not typeset
            table = status.locator("table")
            assert table.evaluate("t => t.getBoundingClientRect().right") <= status.evaluate(
                "o => o.getBoundingClientRect().right") + 1  # inside the panel, nothing cut
            status.screenshot(path=str(ARTIFACTS / "dark-status.png"))

            first = compare.locator("tbody tr").first
            assert first.locator("td").first.evaluate(CONTRAST) >= 4.5  # the highlighted row
            assert compare.locator("p").first.evaluate(CONTRAST) >= 4.5
            compare.scroll_into_view_if_needed()
            compare.screenshot(path=str(ARTIFACTS / "dark-compare.png"))
        finally:
            browser.close()
    assert time.monotonic() - started < 60
