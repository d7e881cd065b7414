"""The Plan `scn.fit` returns: the predicted peak by kind and by module, other batch sizes, the
largest batch that fits, and what to change when it does not fit. Pure arithmetic on the runs
`fit.py` measured; renders itself (text and HTML, the same rows in the same order)."""

from __future__ import annotations

import dataclasses
import html

from ..capacity import Card, size_text
from ..theme import ERROR, GOOD, NO_MATH_CLASSES, no_math
from .storages import KINDS

_MODULES_SHOWN = 12


@dataclasses.dataclass(frozen=True)
class Run:
    """One fake step: its batch size, peak bytes, and what was live at the peak."""

    batch: int
    peak: int
    by_kind: dict[str, int]
    by_module: dict[str, dict[str, int]]


class Plan:
    """What one training step needs. peak: bytes; by_kind: {kind: bytes} at the peak (KINDS);
    fits: whether it fits the card's free memory; max_batch: the largest batch that does (None
    when no card is known); frame(): by module."""

    def __init__(self, model: str, runs: list[Run], bf16: Run | None, card: Card | None,
                 resident: int, global_batch: int, world: int, notes: list[str],
                 blocks: list[str]):
        self.model, self.runs, self.card, self.notes = model, runs, card, notes
        first = runs[0]
        self.batch, self.peak, self.by_kind = first.batch, first.peak, dict(first.by_kind)
        self.global_batch, self.world = global_batch, world
        if len(runs) > 1 and runs[1].batch != first.batch:
            self.per_sample = max((runs[1].peak - first.peak) / (runs[1].batch - first.batch), 0)
        else:  # what scales with the batch: activations and the rest of the step
            self.per_sample = (first.by_kind["activations"] + first.by_kind["other"]) / first.batch
        self.fixed = first.peak - self.per_sample * first.batch
        self.available = (card.free + resident) if card is not None and card.free is not None \
            else None
        self.fits = self.available is None or self.peak <= self.available
        self.max_batch: int | None = None
        if self.available is not None:
            room = self.available - self.fixed
            self.max_batch = (max(int(room // self.per_sample), 0) if self.per_sample > 0
                              else (10 ** 9 if room >= 0 else 0))
        self.bf16_peak = bf16.peak if bf16 is not None else int(
            self.peak - self.by_kind["activations"] / 2)
        self.bf16_measured = bf16 is not None
        self.blocks = self._block_activations(first, blocks)

    def predict(self, batch: int) -> int:
        """Predicted peak bytes at `batch` samples (a line through the measured runs)."""
        return int(self.fixed + self.per_sample * batch)

    def frame(self):
        """The peak by module: bytes of each kind live at the peak, biggest first."""
        import pandas as pd

        rows = [{"module": path, **{k: row.get(k, 0) for k in KINDS},
                 "total": sum(row.values())} for path, row in self.runs[0].by_module.items()]
        frame = pd.DataFrame(rows, columns=["module", *KINDS, "total"])
        return frame.sort_values("total", ascending=False, ignore_index=True)

    # --- what to change ---------------------------------------------------------------------
    def _block_activations(self, run: Run, blocks: list[str]) -> list[tuple[str, int]]:
        sizes = []
        for block in blocks:
            size = sum(row.get("activations", 0) for path, row in run.by_module.items()
                       if path == block or path.startswith(block + "."))
            sizes.append((block, size))
        return sorted(sizes, key=lambda item: -item[1])

    def micro_batch(self) -> tuple[int, int] | None:
        """(micro-batch, accumulation steps) keeping the global batch; None if even 1 fails."""
        if self.max_batch is None or self.max_batch < 1:
            return None
        limit = min(self.max_batch, self.global_batch)
        micro = max(d for d in range(1, limit + 1) if self.global_batch % d == 0)
        return micro, self.global_batch // micro

    def checkpointing(self) -> tuple[int, list[str], int] | None:
        """(N, the N biggest blocks, predicted peak) for the fewest checkpointed blocks that fit.
        A checkpointed block keeps only its input; backward recomputes one block at a time."""
        if self.available is None or not self.blocks:
            return None
        for n in range(1, len(self.blocks) + 1):
            chosen = self.blocks[:n]
            peak = self.peak - sum(s for _, s in chosen) + max(s for _, s in chosen)
            if peak <= self.available:
                return n, [b for b, _ in chosen], int(peak)
        return None

    def advice(self) -> list[str]:
        if self.available is None:
            return ["no card is known to compare with: pin one (scn.pin) or pass device="]
        if self.fits:
            return [f"fits: {size_text(self.peak)} of {size_text(self.available)} available; "
                    f"the largest batch that fits is about {self.max_batch}"]
        out = [f"does not fit: {size_text(self.peak)} needed, {size_text(self.available)} "
               f"available ({size_text(self.peak - self.available)} short)"]
        micro = self.micro_batch()
        job = (f" ({self.world} ranks × {self.global_batch // self.world} per rank)"
               if self.world > 1 else "")
        if micro is not None:
            out.append(f"micro-batch {micro[0]} with {micro[1]} gradient-accumulation steps "
                       f"keeps the global batch of {self.global_batch}{job} "
                       f"(predicted peak {size_text(self.predict(micro[0]))})")
        else:
            out.append("even a batch of 1 does not fit: the parameters, gradients and "
                       "optimizer state alone are too big for this card")
        checkpoint = self.checkpointing()
        if checkpoint is not None:
            n, names, peak = checkpoint
            out.append(f"activation checkpointing of the {n} biggest block{'s' * (n > 1)} "
                       f"({', '.join(names[:6])}{', ...' if n > 6 else ''}): predicted peak "
                       f"{size_text(peak)} (torch.utils.checkpoint)")
        bf16 = "predicted" if self.bf16_measured else "estimated"
        verdict = "fits" if self.bf16_peak <= self.available else "does not fit alone"
        out.append(f"bf16 autocast: {bf16} peak {size_text(self.bf16_peak)} ({verdict})")
        return out

    # --- rendering --------------------------------------------------------------------------
    def headline(self) -> str:
        card = self.card.label if self.card is not None else "no card"
        verdict = "fits" if self.fits else "does NOT fit"
        return (f"scn.fit {self.model}: one training step at batch {self.batch} peaks at "
                f"{size_text(self.peak)}, {verdict} {card}"
                + (f" ({size_text(self.available)} available)" if self.available else ""))

    def _sizes(self) -> list[tuple[str, str, str]]:
        batches = sorted({max(self.batch // 4, 1), max(self.batch // 2, 1), self.batch,
                          2 * self.batch, 4 * self.batch}
                         | ({self.max_batch} if self.max_batch and self.max_batch < 10 ** 8
                            else set()))
        rows = []
        for b in batches:
            peak = self.peak if b == self.batch else self.predict(b)
            mark = "" if self.available is None else ("fits" if peak <= self.available else
                                                      "too big")
            label = f"{b}" + (" (largest that fits)" if b == self.max_batch else "") + (
                " (this batch)" if b == self.batch else "")
            rows.append((label, size_text(peak), mark))
        return rows

    def _modules(self):
        frame = self.frame().head(_MODULES_SHOWN)
        return [(row.module or "(model)", *(size_text(getattr(row, k)) if getattr(row, k)
                                            else "" for k in KINDS), size_text(row.total))
                for row in frame.itertuples()]

    def __repr__(self) -> str:
        lines = [self.headline(), "by kind: " + ", ".join(
            f"{k} {size_text(v)}" for k, v in self.by_kind.items())]
        lines.append("batch sizes:")
        lines += [f"  {b:<26} {p:>10}  {m}" for b, p, m in self._sizes()]
        lines.append("by module (at the peak):")
        head = ("module", *KINDS, "total")
        rows = self._modules()
        widths = [max(len(c) for c in col) for col in zip(head, *rows)]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [head, *rows]]
        lines.append("what to change:")
        lines += [f"  - {a}" for a in self.advice()]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        def table(head, rows) -> str:
            h = "".join(f"<th>{html.escape(c)}</th>" for c in head)
            b = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                        for r in rows)
            return f"<table class='singlecard-nb'><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table>"

        kinds = ", ".join(f"{k} {size_text(v)}" for k, v in self.by_kind.items())
        advice = "".join(f"<li>{html.escape(a)}</li>" for a in self.advice())
        notes = "".join(f"<p>note: {html.escape(n)}</p>" for n in self.notes)
        color = GOOD if self.fits else ERROR
        return no_math(f"<div class='{NO_MATH_CLASSES}' "
                f"style='border-left:3px solid {color};padding:2px 8px'>"
                f"<p><b>{html.escape(self.headline())}</b></p><p>by kind: {html.escape(kinds)}</p>"
                + table(("batch", "predicted peak", ""), self._sizes())
                + "<p>by module (at the peak):</p>"
                + table(("module", *KINDS, "total"), self._modules())
                + f"<p>what to change:</p><ul>{advice}</ul>{notes}</div>")
