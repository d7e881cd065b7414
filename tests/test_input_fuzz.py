"""Fuzzed input: magic lines and machine files. Whatever a user types or a file holds, the
answer is a UsageError (or MachineFileError) of one plain line, and nothing has changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import singlecard_nb as scn
from singlecard_nb import borrow
from singlecard_nb.pinning import devices
from singlecard_nb.pinning.devices import Machine, MachineFileError

MACHINES = Path(__file__).parent / "machines"
FOUR_GPUS = json.loads((MACHINES / "four_gpus.json").read_text())

# Words the magics know, and ones they do not: mixed, quoted and broken
WORDS = ["status", "off", "list", "cpu", "auto", "0", "1", "7", "-1", "watch", "explain",
         "on", "single-card", "picker", "GPU-", "GPU-2f6e", "MIG-", "--force",
         "--default-device", "--no-single-card", "--every", "--include", "--exclude", "all",
         "--grads", "--params", "--trap", "--live", "model", "model.missing", "trainer.model",
         "'", '"', "\\", "=", "*", "**", "{}", "1.5", "0x1", "None", "-", "--", "🙂", "\x00",
         "99999999999999999999999", "'1", '"1', "a b", "%", "#"]
# one line, as a magic is: no character that str.splitlines breaks at
one_line_text = st.text(max_size=8).filter(lambda t: len(f"a{t}b".splitlines()) == 1)
line_of_words = st.lists(st.sampled_from(WORDS) | one_line_text, max_size=5).map(" ".join)
PINNING = ("cpu", "auto", "0", "1", "2", "3", "GPU-", "MIG-", "single-card", "watch",
           "explain", "all")


def _state() -> tuple:
    return (os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("CUDA_DEVICE_ORDER"),
            scn.current(), sorted(o.name for o in borrow.active_owners()))


@pytest.fixture
def shell():  # a test function's shell (its examples share it); each test gets a new one
    devices.use_machine(Machine.from_dict(FOUR_GPUS))
    for name in ("SINGLECARD_NB_DEVICE", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        os.environ.pop(name, None)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "singlecard_nb")
    import torch

    ip.user_ns.update(model=torch.nn.Linear(2, 2), trainer=_Trainer())
    yield ip
    ip.run_line_magic("unload_ext", "singlecard_nb")
    devices.use_machine(None)


class _Trainer:
    @property
    def model(self):  # what a half-built trainer's property does
        raise RuntimeError("the trainer has no model until fit() starts")


def _check(shell, magic: str, line: str) -> None:
    before = _state()
    result = shell.run_cell(f"%{magic} {line}", silent=True)
    error = result.error_in_exec or result.error_before_exec
    if error is None:  # accepted: a real command ran; put the shell back
        shell.run_cell("%inspect off", silent=True)
        shell.run_cell("%singlecard off", silent=True)
        shell.run_cell("%singlecard watch off", silent=True)
        shell.run_cell("%singlecard explain on", silent=True)
        return
    assert isinstance(error, UsageError), f"%{magic} {line!r} raised {error!r}"
    assert str(error).strip() and "\n" not in str(error).strip(), str(error)
    assert _state() == before, f"%{magic} {line!r} changed state though refused"


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(line=line_of_words)
def test_any_singlecard_line_is_a_usage_error_or_works(shell, line):
    _check(shell, "singlecard", line)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(line=line_of_words)
def test_any_inspect_line_is_a_usage_error_or_works(shell, line):
    _check(shell, "inspect", line)


def _mutations() -> st.SearchStrategy[str]:
    valid = json.dumps(FOUR_GPUS)
    cut = st.integers(0, len(valid)).map(lambda i: valid[:i])
    values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
            st.sampled_from(["gpus", "index", "uuid", "name", "memory_total", "mig",
                             "processes", "pid", "unknown", "reason", "x"]), inner, max_size=4),
        max_leaves=12)
    replaced = st.tuples(st.sampled_from(["index", "uuid", "name", "memory_total", "memory_used",
                                          "utilization", "processes", "mig", "pci_bus_id"]),
                         values).map(lambda kv: json.dumps(
                             {"gpus": [{**FOUR_GPUS["gpus"][0], kv[0]: kv[1]}]}))
    extreme = st.sampled_from([
        '{"gpus": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"gpus": [{"index": ' + "9" * 5000 + ', "uuid": "GPU-1", "name": "x"}]}',
        '{"gpus": [{"index": 1e400, "uuid": "GPU-1", "name": "x"}]}',
        "\ufeff{}", "", "null", "[]", '{"gpus": null}', "\x00\x01"])
    return cut | values.map(json.dumps) | replaced | extreme


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=_mutations())
def test_any_machine_file_is_read_or_refused_in_one_line(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("machine") / "machine.json"
    path.write_text(text)
    try:
        machine = devices.read_machine({"SINGLECARD_NB_MACHINE": str(path)})
    except MachineFileError as e:
        message = str(e)
        assert message.startswith(f"SINGLECARD_NB_MACHINE={path}") and "\n" not in message
        assert len(message) < 600, message
    else:
        assert isinstance(machine, Machine)
        repr(machine)  # a machine that was read can be shown
        machine._repr_html_()


def test_the_cpu_pin_works_with_a_broken_machine_file(tmp_path, monkeypatch):
    broken = tmp_path / "broken.json"
    broken.write_text('{"gpus": [')
    monkeypatch.setenv("SINGLECARD_NB_MACHINE", str(broken))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    devices.use_machine(None)
    try:
        state = scn.pin("cpu")
        assert str(state.torch_device) == "cpu"
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
        with pytest.raises(MachineFileError, match="broken.json"):
            scn.pin("0")  # a GPU needs the description, and says which file is broken
    finally:
        scn.release()
