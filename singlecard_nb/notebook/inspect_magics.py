"""`%inspect` and `%%inspect`: the notebook face of `singlecard_nb.inspect` (parse, call, show)."""

from __future__ import annotations

import ast
import io
import tokenize
import warnings
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from ..borrow import Borrowed
from .magic_lines import inspect_options, parse_line

_ACTIONS = ("off", "show")


def _options(func):
    for decorator in reversed([
        argument("--every", type=int, default=1, metavar="N",
                 help="Record steps 0, N, 2N... (a step is one call of the model)."),
        argument("--include", action="append", metavar="GLOB",
                 help="Only modules whose path or class matches (repeatable, or comma-separated)."),
        argument("--exclude", action="append", metavar="GLOB",
                 help="Skip modules whose path or class matches (repeatable)."),
        argument("--grads", action="store_true",
                 help="Also record output gradients and parameter gradients."),
        argument("--params", action="store_true",
                 help="Also record parameters after each optimiser step and the gradients it "
                      "used (what scn.compare_ranks checks)."),
        argument("--trap", action="store_true",
                 help="Raise NonFiniteError at the first NaN/Inf output or gradient."),
        argument("--live", action="store_true",
                 help="Show a view that updates in place while training runs."),
        argument("--max-rows", type=int, default=None, metavar="N",
                 help="Keep at most N rows (ring buffer)."),
        argument("--memory", action="store_true",
                 help="Also bytes of outputs and of what each module saved for backward "
                      "(mem_out, mem_saved); insp.memory() shows what each module holds."),
    ]):
        func = decorator(func)
    return func


@magics_class
class InspectMagics(Magics):
    """Inspectors started by `%inspect`, by the name the user gave the model."""

    def __init__(self, shell: Any):
        super().__init__(shell)
        self.inspectors: dict[str, Any] = {}
        self.finder: Any = None  # `%inspect all`: the inspection.finding.discovery.Discovery
        self.finder_live = False  # `%inspect all --live`: under --ranks, the ranks side by side
        self._events: Borrowed | None = None
        self._flush_callback = self._flush_all  # one bound object: unregister needs the same

    @magic_arguments()
    @argument("what", metavar="MODEL | all | off | show",
              help="A variable holding an nn.Module to inspect across cells; `all`: every "
                   "model the code calls (`%%run train.py`); `off` stops, `show` displays.")
    @argument("name", nargs="?", metavar="MODEL",
              help="With off/show: which model (default: all); `%%inspect all off`.")
    @_options
    @line_magic
    def inspect(self, line: str) -> None:
        """Inspect a model's modules across cells: shapes and statistics of every tensor.

        %inspect model --every 10 --grads    start (or restart with new options); the
                                              Inspector is scn.inspector(model)
        %inspect show [model]                display what was recorded
        %inspect off [model]                 stop and remove every hook
        %inspect all --trap                  every model the code calls (`%run train.py`),
                                              found as called: scn.inspectors()
        %inspect all off                     stop finding and recording; records stay

        Returns nothing: IPython's Out cache would keep a returned Inspector, and with it the
        model, after `%inspect off`.
        """
        args = parse_line(self.inspect, "%inspect", line)
        if args.what == "all":
            from .inspect_all import inspect_all_line

            return inspect_all_line(self, args)
        if args.what in _ACTIONS:
            names = self._known(args.name)
            for name in names:
                insp = self.inspectors[name]
                if args.what == "off":
                    insp.stop()
                    del self.inspectors[name]
                else:
                    insp.flush()
                    display(insp.summary())
            if args.what == "off" and not self.inspectors and not self._finding():
                self._stop_flushing()
            return None
        if args.name is not None:
            raise UsageError(f"%inspect takes one model, got {args.what!r} and {args.name!r}; "
                             "use `%inspect off NAME` or `%inspect show NAME`.")
        model = self._model(args.what)
        insp = self._make(model, args)  # may raise UsageError: nothing changes before this
        previous = self.inspectors.pop(args.what, None)
        if previous is not None:
            previous.stop()
        self.inspectors[args.what] = insp.start()
        self.start_flushing()
        if args.live:
            insp.live()
        return None

    @magic_arguments()
    @argument("what", metavar="MODEL", help="A variable holding an nn.Module.")
    @_options
    @cell_magic("inspect")
    def inspect_cell(self, line: str, cell: str) -> None:
        """Inspect a model during this cell only, then display the summary.

        %%inspect model --grads
        loss = model(x).sum(); loss.backward()

        An error in the cell fails the cell with that error (after the summary), as without the
        magic. The inspector stays reachable: scn.inspector(model) or %inspect show model.
        """
        args = parse_line(self.inspect_cell, "%%inspect", line)
        running = self.inspectors.get(args.what)
        if running is not None and running.active:
            raise UsageError(f"%%inspect: {args.what!r} is already inspected across cells by "
                             f"%inspect; use `%inspect show {args.what}`, or `%inspect off "
                             f"{args.what}` first.")
        insp = self._make(self._model(args.what), args)
        self.inspectors[args.what] = insp.start()
        try:
            if args.live:
                insp.live()
            self._run_body(cell)
        finally:
            insp.stop()  # also after an error or Ctrl-C inside the cell
            self._show_summary(insp)

    # --- helpers ----------------------------------------------------------------------------
    def _run_body(self, cell: str) -> None:
        """Run a cell body in the user's namespace as the shell would, except that an error
        propagates: the cell then fails with the user's own exception (nbclient and "Run all"
        stop there). The value of a last expression is displayed as a cell's would be."""
        shell = self.shell
        source = shell.transform_cell(cell)
        filename = shell.compile.cache(source, shell.execution_count, raw_code=cell)
        tree = shell.compile.ast_parse(source, filename=filename)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(shell.compile(tree, filename, "exec"), shell.user_global_ns, shell.user_ns)
        if last is not None:
            value = eval(shell.compile(last, filename, "eval"), shell.user_global_ns,
                         shell.user_ns)
            if value is not None and not _ends_in_semicolon(source):
                shell.displayhook(value)

    def _show_summary(self, insp) -> None:
        try:
            display(insp.summary())
        except Exception as e:  # the cell's own error, if any, must stay the one raised
            warnings.warn(f"singlecard_nb: could not display the summary: {e!r}", stacklevel=2)

    def _model(self, name: str):
        import torch

        head, *attributes = name.split(".")
        if not head.isidentifier() or head not in self.shell.user_ns:
            raise UsageError(f"%inspect: no variable named {head!r} in this notebook; give the "
                             "name of an nn.Module, e.g. `%inspect model`.")
        value = self.shell.user_ns[head]
        for attribute in attributes:
            if not attribute.isidentifier():
                raise UsageError(f"%inspect: {name!r} is not a dotted name of a variable, e.g. "
                                 "`%inspect model` or `%inspect trainer.model`.")
            try:  # a property may run code: whatever it raises is the answer, not a traceback
                value = getattr(value, attribute)
            except AttributeError:
                raise UsageError(f"%inspect: {name!r} has no attribute {attribute!r}.") from None
            except Exception as e:
                raise UsageError(f"%inspect: reading {name!r} raised {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
                                 ) from None
        if not isinstance(value, torch.nn.Module):
            raise UsageError(f"%inspect: {name!r} is a {type(value).__name__}, not a "
                             "torch.nn.Module.")
        return value

    def _make(self, model, args):
        from ..inspection.engine import Inspector

        try:
            return Inspector(model, **inspect_options(args))
        except (TypeError, ValueError) as e:  # e.g. a TorchScript module
            raise UsageError(f"%inspect: {e}") from None

    def _known(self, name: str | None) -> list[str]:
        if name is None:
            return list(self.inspectors)
        if name not in self.inspectors:
            known = ", ".join(self.inspectors) or "none"
            raise UsageError(f"%inspect: {name!r} is not being inspected (inspected: {known}).")
        return [name]

    def _flush_all(self, *_: Any) -> None:
        # A training cell ends mid-step: show its last step without waiting for the next one.
        # flush() also closes a call of the model that Ctrl-C interrupted in this cell.
        for insp in self.inspectors.values():
            if insp.active:
                insp.flush()
        if self.finder is not None and self.finder.active:
            self.finder.flush()

    def start_flushing(self) -> None:
        """Flush every inspector after each cell (once per shell; `%inspect all` asks too)."""
        if self._events is None:
            owner = Borrowed("%inspect: statistics at the end of each cell")
            self.shell.events.register("post_run_cell", self._flush_callback)
            owner.on_restore(lambda: self.shell.events.unregister("post_run_cell",
                                                                  self._flush_callback),
                             "post_run_cell callback")
            owner.on_restore(self._forget, "inspectors started by %inspect")
            self._events = owner

    def _finding(self) -> bool:
        return self.finder is not None and self.finder.active

    def _stop_flushing(self) -> None:
        owner, self._events = self._events, None
        if owner is not None:
            owner.restore()

    def _forget(self) -> None:
        # Runs on unload (borrow.restore_all): the inspectors' own owners remove their hooks.
        self.inspectors.clear()
        self._events = None
        self.finder = None


def _ends_in_semicolon(source: str) -> bool:
    """A cell whose last expression ends in `;` shows no value, as IPython's cells. Checked
    here: early IPython 8 releases have no check of a given source (their displayhook.quiet
    reads the history's last entry, which is this magic's line, not its cell)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return False
    skipped = (tokenize.ENDMARKER, tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)
    for token in reversed(tokens):
        if token.type not in skipped:
            return token.type == tokenize.OP and token.string == ";"
    return False
