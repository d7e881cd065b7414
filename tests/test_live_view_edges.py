"""The live view where users meet its edges: any module name is data, never markup; the page's
search follows Python's rules; a script gets its final table at stop()."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess

import pytest
import torch
from torch import nn

import singlecard_nb as scn
from singlecard_nb.inspection.views import live, live_html

NODE = shutil.which("node")


class Named(nn.Module):
    """A model whose submodule is registered under a name that looks like markup."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.add_module(name, nn.Linear(4, 4))
        self.after = nn.Linear(4, 2)
        self.name = name

    def forward(self, x):
        return self.after(getattr(self, self.name)(x))


def _page(model: nn.Module) -> str:
    with scn.inspect(model) as insp:
        for _ in range(2):
            model(torch.ones(1, 4))
    return live.LiveView(insp, shell=None)._bundle()["text/html"]


def test_a_module_named_like_markup_stays_data_in_the_page():
    name = "<!--<script>"
    page = _page(Named(name))
    data = re.search(r"<script type='application/json' class='scn-data'>(.*?)</script>", page,
                     re.S).group(1)
    # no '<' at all: the parser's script-escape states (<!--, <script) can never start, so the
    # element ends at our </script> and everything after it stays in the document
    assert "<" not in data and ">" not in data
    rows = json.loads(data)["rows"]
    assert name in {r["module"] if isinstance(r, dict) else r[2] for r in rows}
    assert page.endswith("</script></div>") and page.count("<script") == page.count("</script>")


def _node(code: str) -> str:
    done = subprocess.run([NODE, "-e", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(NODE is None, reason="needs node to run the page's script")
def test_the_pages_glob_search_matches_what_pythons_search_matches():
    terms = ["h.[0", "[", "h.[01].*", "*[!0].mlp", "h.[!]", "[]x]", "*.c_fc", "h.?.attn",
             "a[b", "[a-c]*", "*(x)*", "h.1+", "[^h]*"]
    paths = ["h.[0", "h.0.mlp", "h.1.mlp", "h.9.attn", "]x", "x", "b.c_fc", "a[b", "(x)",
             "h.1+", "^h", "h.!", "[", "c"]
    code = live_html.GLOB_JS + f"""
var terms={json.dumps(terms)},paths={json.dumps(paths)},out={{}};
terms.forEach(function(t){{var re=globRe(t);out[t]=paths.filter(function(p){{
  return re!==null&&re.test(p);}});}});
console.log(JSON.stringify(out));"""
    page = json.loads(_node(code))
    python = {t: [p for p in paths if fnmatch.fnmatchcase(p, t)] for t in terms}
    assert page == python
    script = _page(Named("x")).split("<script>")[-1][:-len("</script></div>")]
    _node(f"new Function({json.dumps(script)})")  # the page's whole script compiles


def test_a_scripts_live_view_prints_at_stop_also_when_its_rows_were_read(monkeypatch, capsys):
    monkeypatch.setattr(live, "_current_shell", lambda: None)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    insp = scn.inspect(model)
    view = insp.live()
    for _ in range(3):
        model(torch.randn(5, 8))
    assert len(view.rows()) == 3  # reading them takes the last step to the host already
    assert capsys.readouterr().out == ""
    insp.stop()
    out = capsys.readouterr().out
    assert out.startswith("live inspection · step 2 · 4 modules · stopped")
