"""What the cell shows while N ranks run under `%inspect all`: each rank's recorded steps so
far, one line updated in place (`Progress`), or with `--live` the ranks side by side, module by
module (`SideBySide`); both read the ranks' small status files, never their records."""

from __future__ import annotations

import html
from typing import Any

from IPython.display import display

from ..ranks.rank_status import RECORDS


class Progress:
    """Under `%inspect all`: each rank's recorded steps so far, one line updated in place."""

    def __init__(self, ranks: int):
        from IPython import get_ipython

        from ..inspection.views import updates_in_place

        self.ranks = ranks
        self.handle: Any = None
        self.updates = 0  # how many times the output was drawn
        self._last = ""
        # a terminal IPython prints every update anew: there only the last state is shown
        shell = get_ipython()
        self.in_place = shell is None or updates_in_place(shell)

    def update(self, statuses: dict[int, Any], state: str = "running",
               note: str | None = None) -> None:
        models: dict[str, dict[int, int]] = {}
        for rank, status in statuses.items():
            for name, steps in ((status or {}).get(RECORDS) or {}).items():
                models.setdefault(name, {})[rank] = steps
        if not models:
            return
        text = "records so far: " + "; ".join(
            f"{name}: " + " | ".join(f"rank {r} step {by_rank.get(r, 0)}"
                                     for r in range(self.ranks))
            for name, by_rank in models.items())
        if note:
            text += f" · {note}"
        self._show({"text/plain": text}, text, final=state != "running")

    def _show(self, bundle: dict[str, str], text: str, final: bool = False) -> None:
        if text == self._last or not (self.in_place or final):
            return
        self._last = text
        if self.handle is None:
            self.handle = display(bundle, raw=True, display_id=True)
        else:
            self.handle.update(bundle, raw=True)
        self.updates += 1


class SideBySide(Progress):
    """Under `%inspect all --live`: the ranks side by side, module by module, ranked by where
    they disagree, one output updated in place: looked at twice a second, redrawn when a rank
    sent something new (each sends once a second)."""

    def __init__(self, ranks: int):
        from ..inspection.runs import SideBySide as View

        super().__init__(ranks)
        self.view = View(ranks)
        self.error: str | None = None

    def update(self, statuses: dict[int, Any], state: str = "running",
               note: str | None = None) -> None:
        if self.error is not None:
            return
        try:
            if not self.view.feed(statuses) and state == "running":
                return
            if not self.view.rows():
                return
            bundle = self.view.bundle(state)
        except Exception as e:  # drawing must never stop the ranks: said once, in the output
            self.error = f"{type(e).__name__}: {e}"
            text = (f"ranks side by side: the view failed ({self.error}); the ranks go on, "
                    "and their records are read back after the run. See docs/ranks.md.")
            bundle = {"text/plain": text, "text/html": f"<pre>{html.escape(text)}</pre>"}
        self._show(bundle, bundle["text/plain"], final=state != "running")
