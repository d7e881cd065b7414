"""Bad described machines and bad settings, through the magics: a malformed SINGLECARD_NB_MACHINE
is one line naming the file, the entry and the field; loading the extension never raises."""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import run_fresh_python
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from singlecard_nb.notebook import extension, magics
from singlecard_nb.pinning import devices, pinning

GOOD_GPU = {"index": 0, "uuid": "GPU-aaaa", "name": "A100", "memory_total": 2**30}

# (file content, the entry and field the message must name)
BAD_FILES = {
    "gpu is a number": ('{"gpus": [1]}', "gpus[0]: expected an object, got 1"),
    "null memory": (json.dumps({"gpus": [{**GOOD_GPU, "memory_total": None}]}),
                    "gpus[0].memory_total: expected a whole number ≥ 0, got null"),
    "infinite memory": ('{"gpus": [{"index": 0, "uuid": "GPU-a", "name": "x", '
                        '"memory_used": Infinity}]}',
                        "gpus[0].memory_used: expected a whole number ≥ 0, got Infinity"),
    "process without pid": (json.dumps({"gpus": [{**GOOD_GPU, "processes": [{"user": "bob"}]}]}),
                            "gpus[0].processes[0].pid: missing"),
    "mig without uuid": (json.dumps({"gpus": [{**GOOD_GPU, "mig": [{"index": 0}]}]}),
                         "gpus[0].mig[0].uuid: missing"),
    "name not a string": (json.dumps({"gpus": [{**GOOD_GPU, "name": 3}]}),
                          "gpus[0].name: expected a string, got 3"),
    "invalid json": ('{"gpus": [}', "not valid JSON"),
}


@pytest.fixture
def machine_file(tmp_path, monkeypatch, shown):
    """Point SINGLECARD_NB_MACHINE at a file; `write(content)` fills it (the path is returned)."""
    for name in ("SINGLECARD_NB_DEVICE", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "machine.json"
    monkeypatch.setenv("SINGLECARD_NB_MACHINE", str(path))
    devices.use_machine(None)

    def write(content: str):
        path.write_text(content)
        return path

    yield write
    shell = InteractiveShell.instance()
    if "singlecard_nb" in shell.extension_manager.loaded:
        shell.run_line_magic("unload_ext", "singlecard_nb")


def load(monkeypatch=None, device: str | None = None):
    if device is not None:
        monkeypatch.setenv("SINGLECARD_NB_DEVICE", device)
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "singlecard_nb")
    return shell


def usage_error(shell, line: str) -> str:
    result = shell.run_cell(line)
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    return str(result.error_in_exec)


@pytest.mark.parametrize("content, words", BAD_FILES.values(), ids=BAD_FILES.keys())
@pytest.mark.parametrize("line", ["%singlecard list", "%singlecard 0", "%singlecard auto",
                                  "%singlecard picker"])
def test_each_command_says_in_one_line_what_is_wrong(machine_file, shown, content, words, line):
    path = machine_file(content)
    ip = load()
    message = usage_error(ip, line)
    assert f"SINGLECARD_NB_MACHINE={path}: " in message and words in message
    assert "\n" not in message
    assert pinning.current() is None and shown == []


@pytest.mark.parametrize("content, words", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_status_shows_the_broken_file_instead_of_failing(machine_file, shown, content, words):
    path = machine_file(content)
    ip = load()
    assert ip.run_cell("%singlecard status").error_in_exec is None
    (status,) = shown
    assert status.machine_error.startswith(f"SINGLECARD_NB_MACHINE={path}: ")
    assert words in repr(status) and "cannot be read" in repr(status)


def test_a_missing_file(machine_file, tmp_path):
    ip = load()
    assert "machine.json: cannot read the file: No such file or directory" in usage_error(
        ip, "%singlecard list")


def test_the_picker_api_raises_the_same_one_line_error(machine_file):
    machine_file(BAD_FILES["process without pid"][0])
    from singlecard_nb.notebook import picker

    with pytest.raises(devices.MachineFileError, match=r"gpus\[0\]\.processes\[0\]\.pid: missing"):
        picker.picker()


@pytest.mark.parametrize("content, words", BAD_FILES.values(), ids=BAD_FILES.keys())
@pytest.mark.parametrize("device", ["auto", "0", "cpu"])
def test_loading_never_raises_whatever_the_file_and_device_say(
        machine_file, monkeypatch, capsys, content, words, device):
    machine_file(content)
    ip = load(monkeypatch, device)
    assert "singlecard_nb" in ip.extension_manager.loaded
    assert "singlecard" in ip.magics_manager.magics["line"]
    if device != "cpu":  # the CPU needs no GPU list
        err = capsys.readouterr().err
        assert f"SINGLECARD_NB_DEVICE={device!r} was NOT pinned" in err and words in err
        assert pinning.current() is None
    ip.run_line_magic("unload_ext", "singlecard_nb")  # not "not loaded"
    assert "singlecard" not in ip.magics_manager.magics["line"]


def test_an_unexpected_error_while_pinning_at_load_is_shown_not_raised(
        machine_file, monkeypatch, capsys):
    machine_file(json.dumps({"gpus": [GOOD_GPU]}))

    def broken(*args, **kwargs):
        raise KeyError("pid")

    monkeypatch.setattr(magics.session, "pin", broken)
    ip = load(monkeypatch, "0")
    err = capsys.readouterr().err
    assert "was NOT pinned because of an internal error (KeyError: 'pid'" in err
    assert "Traceback" in err  # our bug stays visible
    assert "singlecard_nb" in ip.extension_manager.loaded


def test_registering_is_all_or_nothing(machine_file, monkeypatch):
    shell = InteractiveShell.instance()
    registered = []
    real = shell.register_magics

    def second_fails(instance):
        if registered:
            raise RuntimeError("registry full")
        registered.append(instance)
        real(instance)

    monkeypatch.setattr(shell, "register_magics", second_fails)
    with pytest.raises(RuntimeError, match="registry full"):
        extension.load(shell)
    assert "singlecard" not in shell.magics_manager.magics["line"]
    assert "SingleCardMagics" not in shell.magics_manager.registry
    assert id(shell) not in extension._registered
    monkeypatch.undo()
    extension.load(shell)  # a later load is not fooled into thinking it is loaded
    assert "singlecard" in shell.magics_manager.magics["line"]
    extension.unload(shell)


@pytest.mark.slow
def test_kernel_start_with_a_malformed_file_in_a_fresh_process(tmp_path):
    path = tmp_path / "machine.json"
    path.write_text(BAD_FILES["process without pid"][0])
    code = textwrap.dedent("""
        import json
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "singlecard_nb")
        loaded = "singlecard_nb" in ip.extension_manager.loaded
        ip.run_line_magic("unload_ext", "singlecard_nb")
        magics = "singlecard" in ip.magics_manager.magics["line"]
        print(json.dumps({"loaded": loaded, "magics after unload": magics}))
    """)
    out, printed = run_fresh_python(code, SINGLECARD_NB_MACHINE=str(path),
                                    SINGLECARD_NB_DEVICE="auto")
    assert out == {"loaded": True, "magics after unload": False}
    assert "not loaded" not in printed


# --- files that are no files ------------------------------------------------------------------
def test_a_fifo_is_refused_by_name_instead_of_hanging_the_list(machine_file, tmp_path,
                                                                monkeypatch):
    import os
    import threading

    fifo = tmp_path / "machine.fifo"
    os.mkfifo(fifo)
    monkeypatch.setenv("SINGLECARD_NB_MACHINE", str(fifo))
    ip = load()
    result: list = []
    worker = threading.Thread(target=lambda: result.append(ip.run_cell("%singlecard list")),
                              daemon=True)
    worker.start()
    worker.join(20)
    hung = worker.is_alive()
    if hung:  # give the blocked open a writer so the thread ends
        os.close(os.open(fifo, os.O_WRONLY))
        worker.join(20)
    assert not hung, "%singlecard list waited on the FIFO"
    error = result[0].error_in_exec
    assert isinstance(error, UsageError)
    assert f"SINGLECARD_NB_MACHINE={fifo}: not a regular file (a FIFO)" in str(error)


def test_dev_zero_is_refused_by_name_without_reading_it():
    # in a process whose memory is capped: the old reader grew until MemoryError
    code = textwrap.dedent("""
        import json, resource
        resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))
        from singlecard_nb.pinning import devices
        try:
            devices.read_machine()
        except BaseException as e:
            print(json.dumps({"type": type(e).__name__, "message": str(e)}))
    """)
    out, _ = run_fresh_python(code, SINGLECARD_NB_MACHINE="/dev/zero")
    assert out == {"type": "MachineFileError", "message": "SINGLECARD_NB_MACHINE=/dev/zero: not "
                   "a regular file (a character device); point it at a JSON file describing "
                   "the machine"}


def test_a_file_too_large_to_describe_a_machine_is_refused_by_name(machine_file):
    from singlecard_nb.pinning import machine_file as files

    path = machine_file(" " * (files.MAX_FILE_BYTES + 1))
    ip = load()
    message = usage_error(ip, "%singlecard list")
    assert f"SINGLECARD_NB_MACHINE={path}: " in message and "larger than a machine" in message
