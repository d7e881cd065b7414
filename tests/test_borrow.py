"""Borrowed owners give back what they changed and keep what others changed afterwards."""

from __future__ import annotations

import gc
import os
import types
import weakref
from collections import OrderedDict

import pytest

from singlecard_nb import borrow


def test_env_restore_puts_back_the_previous_value_or_removes_the_variable():
    environ = {"KEPT": "old"}
    with borrow.Borrowed("test") as owner:
        owner.set_env("KEPT", "ours", environ)
        owner.set_env("NEW", "ours", environ)
        owner.set_env("KEPT2", None, environ)  # unsetting something absent: still nothing
        assert environ == {"KEPT": "ours", "NEW": "ours"}
    assert environ == {"KEPT": "old"}


def test_env_changed_by_the_user_after_us_is_theirs_and_stays():
    environ = {"MASTER_ADDR": "10.0.0.1"}
    owner = borrow.Borrowed("test")
    owner.set_env("MASTER_PORT", "41234", environ)
    owner.set_env("MASTER_ADDR", "127.0.0.1", environ)
    owner.set_env("GONE", "ours", environ)
    environ["MASTER_PORT"] = "29999"  # the user's own choice, while we hold the variable
    environ["MASTER_ADDR"] = "10.0.0.9"
    del environ["GONE"]
    owner.restore()
    assert environ == {"MASTER_PORT": "29999", "MASTER_ADDR": "10.0.0.9"}


def test_env_unset_by_us_and_set_again_by_the_user_stays():
    environ = {"CUDA_VISIBLE_DEVICES": "0,1"}
    owner = borrow.Borrowed("test")
    owner.set_env("CUDA_VISIBLE_DEVICES", None, environ)
    environ["CUDA_VISIBLE_DEVICES"] = "3"
    owner.restore()
    assert environ == {"CUDA_VISIBLE_DEVICES": "3"}


def test_nested_env_changes_restored_in_any_order_keep_a_later_user_value():
    environ: dict[str, str] = {}
    lower, upper = borrow.Borrowed("lower"), borrow.Borrowed("upper")
    lower.set_env("PORT", "1", environ)
    upper.set_env("PORT", "2", environ)
    lower.restore()  # out of order: upper now restores what lower found (nothing)
    assert environ == {"PORT": "2"}
    upper.restore()
    assert environ == {}

    lower.set_env("PORT", "1", environ)
    upper.set_env("PORT", "2", environ)
    environ["PORT"] = "user"
    lower.restore()
    upper.restore()
    assert environ == {"PORT": "user"}


def test_attributes_are_still_restored_exactly():
    target = types.SimpleNamespace(fn=len)
    with borrow.Borrowed("test") as owner:
        owner.set_attr(target, "fn", max)
        owner.set_attr(target, "extra", 1)
    assert target.fn is len and not hasattr(target, "extra")


def test_restore_on_an_exception_gives_back_and_keeps_the_exception():
    environ = {"A": "x"}
    with pytest.raises(RuntimeError, match="boom"), borrow.Borrowed("test") as owner:
        owner.set_env("A", "y", environ)
        raise RuntimeError("boom")
    assert environ == {"A": "x"}


# --- through the magic ------------------------------------------------------------------------
@pytest.fixture
def shell(monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    for name in ("MASTER_PORT", "MASTER_ADDR", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                 "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "singlecard_nb")
    yield ip
    ip.run_line_magic("unload_ext", "singlecard_nb")


def test_a_master_port_set_while_pinned_survives_singlecard_off(shell, monkeypatch):
    shell.run_line_magic("singlecard", "cpu")
    ours = os.environ["MASTER_PORT"]  # single-card mode provides a free port
    shell.run_cell("import os; os.environ['MASTER_PORT'] = '29999'").raise_error()
    shell.run_line_magic("singlecard", "off")
    assert os.environ.get("MASTER_PORT") == "29999" != ours
    assert "RANK" not in os.environ and "MASTER_ADDR" not in os.environ  # ours: given back
    monkeypatch.delenv("MASTER_PORT")


def test_a_variable_left_as_we_set_it_is_given_back_by_unload(shell):
    shell.run_line_magic("singlecard", "cpu")
    assert os.environ["WORLD_SIZE"] == "1"
    shell.run_line_magic("unload_ext", "singlecard_nb")
    assert "WORLD_SIZE" not in os.environ and "MASTER_PORT" not in os.environ
    shell.run_line_magic("load_ext", "singlecard_nb")  # the fixture unloads again


class _Target:
    value = "torch's"


class _Patching(borrow.Listeners):
    name = "test: listeners"

    def install(self, owner):
        owner.set_attr(_Target, "value", "patched", "the shared patch")


def test_listeners_share_one_patch_made_by_the_first_and_given_back_by_the_last():
    shared = _Patching()
    first, second = (lambda: None), (lambda: None)
    shared.add(first)
    shared.add(second)
    assert _Target.value == "patched" and shared.listeners == (first, second)
    shared.discard(first)
    assert _Target.value == "patched"
    shared.discard(second)
    assert _Target.value == "torch's" and borrow.active_owners() == []


def test_kept_listeners_keep_their_patch_until_restore_all_and_a_failed_install_leaves_nothing():
    class Kept(_Patching):
        keep = True

    kept = Kept()
    kept.add(print)
    kept.discard(print)
    assert _Target.value == "patched"
    borrow.restore_all()
    assert _Target.value == "torch's"

    class Failing(_Patching):
        def install(self, owner):
            super().install(owner)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Failing().add(print)
    assert _Target.value == "torch's" and borrow.active_owners() == []


def test_an_item_set_twice_is_given_back_in_either_order():
    table = {"run": "ipython's"}
    lower, upper = borrow.Borrowed("lower"), borrow.Borrowed("upper")
    lower.set_item(table, "run", "lower's", "run")
    upper.set_item(table, "run", "upper's", "run")
    lower.restore()  # the lower one first: the upper one now gives back what lower found
    assert table["run"] == "upper's"
    upper.restore()
    assert table == {"run": "ipython's"}

    added = borrow.Borrowed("adds")
    added.set_item(table, "new", 1, "new")
    table["new"] = 2  # someone else's since: theirs, kept
    added.restore()
    assert table["new"] == 2


def test_after_import_runs_once_the_module_is_imported_and_leaves_nothing(tmp_path, monkeypatch):
    import sys

    (tmp_path / "p33_late.py").write_text("VALUE = 1\n")
    (tmp_path / "p33_never.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finders = list(sys.meta_path)
    owner = borrow.Borrowed("test")
    owner.after_import("p33_late", lambda module: owner.set_attr(module, "VALUE", 2), "late")
    owner.after_import("p33_never", seen.append, "never")
    assert seen == [] and "p33_late" not in sys.modules  # nothing imported to patch it
    import p33_late

    assert p33_late.VALUE == 2 and type(p33_late.__loader__).__name__ == "SourceFileLoader"
    owner.after_import("p33_late", seen.append, "already imported")  # imported: at once
    assert seen == [p33_late]
    owner.restore()
    assert p33_late.VALUE == 1 and sys.meta_path == finders  # the finder left with its owner
    import p33_never  # noqa: F401  (after restore: nothing runs)

    assert seen == [p33_late]
    for name in ("p33_late", "p33_never"):
        sys.modules.pop(name)


# --- HookEntries: entries of torch's hook tables, put in and taken out by key ---------------

class _Reading(OrderedDict):
    """A hook table noting, at each change, what a reader of `other` would see with it."""

    def __init__(self, other: dict):
        super().__init__()
        self.other, self.seen = other, []

    def __setitem__(self, key, value):
        self.seen.append(("in", key, key in self.other))
        super().__setitem__(key, value)

    def pop(self, key, *default):
        self.seen.append(("out", key, key in self.other))
        return super().pop(key, *default)


def test_hook_entries_go_in_in_order_and_out_in_reverse_any_number_of_times():
    flags: OrderedDict = OrderedDict()
    hooks = _Reading(flags)
    entries = borrow.HookEntries([(flags, 7, True), (hooks, 7, print)])
    entries.put()
    entries.put()  # already in: nothing moves
    assert flags == {7: True} and hooks == {7: print}
    assert hooks.seen == [("in", 7, True)]  # the hook never went in without its flag
    entries.remove()
    entries.remove()  # already out: nothing raised
    assert flags == {} and hooks == {}
    assert hooks.seen[1] == ("out", 7, True)  # the hook left before its flag


def test_hook_entries_hold_their_tables_weakly():
    table: OrderedDict = OrderedDict({1: print})
    entries = borrow.HookEntries([(table, 1, print)])
    gone = weakref.ref(table)
    del table
    gc.collect()
    assert gone() is None  # the handle kept no table alive
    entries.remove()
    entries.put()  # a table gone: passed over


def test_hook_entries_as_a_context_manager_are_out_at_its_end_also_on_an_exception():
    table: OrderedDict = OrderedDict()
    with pytest.raises(RuntimeError), borrow.HookEntries([(table, 3, print)]) as entries:
        entries.put()
        assert table == {3: print}
        raise RuntimeError
    assert table == {}


def _torchs(hook) -> bool:
    return hook == "torch's"


def test_taken_out_hooks_come_back_exactly_where_they_were_on_an_exception():
    forward = OrderedDict([(1, "user's a"), (2, "torch's"), (3, "user's b"), (4, "torch's")])
    pre = OrderedDict([(5, "user's c")])
    before = (list(forward.items()), list(pre.items()))
    entries = borrow.HookEntries.taken_from([forward, pre], keep=_torchs)
    assert len(entries) == 3
    with pytest.raises(KeyboardInterrupt), entries.taken_out():
        assert list(forward.items()) == [(2, "torch's"), (4, "torch's")] and pre == {}
        raise KeyboardInterrupt
    assert (list(forward.items()), list(pre.items())) == before  # the same order, too


def test_a_hook_added_while_others_are_taken_out_stays_after_them():
    table = OrderedDict([(1, "user's"), (2, "torch's")])
    with borrow.HookEntries.taken_from([table], keep=_torchs).taken_out():
        table[9] = "added meanwhile"
    assert list(table) == [1, 2, 9]
