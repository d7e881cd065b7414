"""Checks of the quickstart's outputs in JupyterLab's dark theme, run inside test_browser's
session (one JupyterLab, one kernel, one browser: a few seconds more, not a second session).

Measured in the page, as a person would see it: the contrast of text on its (composited)
background, no `$` typeset by MathJax, the status table inside its panel, and a comparison's
table. Screenshots go to test-artifacts/browser/dark-*.png.
"""

from __future__ import annotations

import re
from pathlib import Path

# One line (typed into a new cell): two runs of one layer, one weight 10% off, compared.
COMPARE_CELL = (
    "a, b = nn.Linear(8, 4), nn.Linear(8, 4); b.load_state_dict(a.state_dict()); "
    "b.weight.data *= 1.1; x = torch.randn(4, 8); runs = [scn.inspect(m) for m in (a, b)]; "
    "[m(x) for m in (a, b)]; [r.stop() for r in runs]; scn.compare(*runs)"
)

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




def switch_theme(page, name: str) -> None:
    """Settings > Theme > `name` ("JupyterLab Dark" or "JupyterLab Light"), unless it is on
    already: the choice is kept in the server's user settings, shared by this file's tests."""
    from playwright.sync_api import expect

    light = "true" if name == "JupyterLab Light" else "false"
    themed = page.locator(f"body[data-jp-theme-light='{light}']")
    if themed.count():
        return
    page.locator(".lm-MenuBar-itemLabel", has_text="Settings").click()
    page.locator(".lm-Menu-itemLabel", has_text="Theme").first.click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{name}$")).click()
    expect(themed).to_have_count(1, timeout=10_000)


def check_dark_theme(page, artifacts: Path) -> None:
    """Switch the open quickstart to JupyterLab Dark and check what it shows (after its cells
    ran and GPU 2 was pinned from the picker)."""
    from playwright.sync_api import expect

    switch_theme(page, "JupyterLab Dark")

    picker = page.locator(".singlecard-picker")
    pinned = picker.locator("tr.singlecard-gpu", has_text="pinned")
    expect(pinned).to_have_count(1)
    picker.scroll_into_view_if_needed()
    picker.screenshot(path=str(artifacts / "dark-picker.png"))
    # the pinned row: the theme's text on a green tint, and its mark
    assert pinned.locator("td").nth(1).evaluate(CONTRAST) >= 4.5
    assert pinned.locator("b", has_text="pinned").evaluate(CONTRAST) >= 3
    for line in picker.locator("div[style*='color']").all():  # status and notes
        assert line.evaluate(CONTRAST) >= 4.5, line.inner_text()

    status = page.locator(".jp-OutputArea-output", has=page.locator(".singlecard-status"))
    expect(status).to_contain_text("$CUDA_VISIBLE_DEVICES")  # shown as written
    assert status.locator("mjx-container, .MathJax").count() == 0  # not typeset
    table = status.locator("table")
    assert table.evaluate("t => t.getBoundingClientRect().right") <= status.evaluate(
        "o => o.getBoundingClientRect().right") + 1  # inside the panel, nothing cut off
    status.scroll_into_view_if_needed()
    status.screenshot(path=str(artifacts / "dark-status.png"))

    # a comparison, in a new cell at the end
    last = page.locator(".jp-CodeCell").last
    last.locator(".jp-InputPrompt").click()
    page.keyboard.press("b")  # command mode: a new cell below
    page.keyboard.press("Enter")
    page.keyboard.insert_text(COMPARE_CELL)
    page.keyboard.press("Control+Enter")
    compare = page.locator(".singlecard-compare")
    expect(compare).to_be_visible(timeout=20_000)
    first = compare.locator("tbody tr").first
    assert first.locator("td").first.evaluate(CONTRAST) >= 4.5  # the highlighted row
    assert compare.locator("p").first.evaluate(CONTRAST) >= 4.5
    compare.scroll_into_view_if_needed()
    compare.screenshot(path=str(artifacts / "dark-compare.png"))
