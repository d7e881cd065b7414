"""`%singlecard watch`: per-cell peak and net memory, through a real InteractiveShell."""

from __future__ import annotations

import textwrap

import pytest
from conftest import run_fresh_python
from IPython.core.interactiveshell import InteractiveShell

from singlecard_nb import borrow
from singlecard_nb.notebook import watch

MIB = 2**20


@pytest.fixture
def shell():
    ip = InteractiveShell.instance()
    yield ip
    watch.stop(ip)


@pytest.fixture
def reports(monkeypatch):
    shown: list[watch.CellMemory] = []
    monkeypatch.setattr(watch, "display", shown.append)
    return shown


def _callbacks(ip) -> list:
    return ip.events.callbacks["pre_run_cell"] + ip.events.callbacks["post_run_cell"]


RSS_OF_TWO_CELLS = """
    import json
    from IPython.core.interactiveshell import InteractiveShell
    from singlecard_nb.notebook import watch
    reports = []
    watch.display = reports.append
    shell = InteractiveShell.instance()
    shell.run_cell("import torch")  # importing torch costs RSS itself: before watching
    watch.start(shell)
    shell.run_cell("kept = torch.ones(64 * 2**20 // 4)")  # 64 MiB kept
    shell.run_cell("tmp = torch.ones(160 * 2**20 // 4); del tmp")  # 160 MiB, freed again
    print(json.dumps([{"device": r.device, "kind": r.kind, "net": r.net, "peak": r.peak,
                       "now": r.now, "text": repr(r)} for r in reports]))
"""


def test_reports_net_and_peak_rss_of_each_cell():
    # A fresh interpreter, as a new kernel is: RSS figures of a long-lived test process depend
    # on what its allocator kept from earlier tests (freed heap is reused without new pages).
    reports, _ = run_fresh_python(textwrap.dedent(RSS_OF_TWO_CELLS))
    assert len(reports) == 2
    kept, freed = reports
    assert kept["device"] == "cpu" and kept["kind"] == "RSS"
    assert 56 * MIB < kept["net"] < 96 * MIB
    assert kept["peak"] >= kept["now"]
    # The freed tensor shows in the peak, not in the net change.
    assert abs(freed["net"]) < 24 * MIB
    assert freed["peak"] >= freed["now"] - freed["net"] + 150 * MIB
    assert all(word in freed["text"] for word in ("peak", "net", "RSS"))


SAMPLED_PEAK = """
    import json
    from IPython.core.interactiveshell import InteractiveShell
    from singlecard_nb.notebook import watch
    reports = []
    watch.display = reports.append
    watch._reset_rss_peak = lambda: False  # as a kernel where /proc/self/clear_refs is refused
    shell = InteractiveShell.instance()
    shell.run_cell("import time, torch")
    watch.start(shell)
    shell.run_cell("tmp = torch.ones(128 * 2**20 // 4); time.sleep(0.1); del tmp")
    print(json.dumps([{"exact": r.peak_exact, "net": r.net, "peak": r.peak, "now": r.now,
                       "text": repr(r)} for r in reports]))
"""


def test_sampled_peak_is_labelled_when_the_kernel_peak_cannot_be_reset():
    # A fresh interpreter, as above: in a long-lived test process the allocator may hand the
    # tensor pages it already holds, and RSS never rises for the sampler to see (floor lane).
    (report,), _ = run_fresh_python(textwrap.dedent(SAMPLED_PEAK))
    assert not report["exact"]
    assert "sampled" in report["text"]
    assert report["peak"] >= report["now"] - report["net"] + 100 * MIB  # the sampler saw the tensor


def test_stop_and_unload_remove_the_callbacks(shell, reports):
    before = list(_callbacks(shell))
    watch.start(shell)
    watch.start(shell)  # idempotent: still one pair of callbacks
    assert len(_callbacks(shell)) == len(before) + 2
    watch.stop(shell)
    assert _callbacks(shell) == before
    shell.run_cell("x = 1")
    assert reports == []

    watch.start(shell)
    borrow.restore_all()  # what %unload_ext does
    assert _callbacks(shell) == before and not watch.is_watching(shell)
    watch.start(shell)  # and it can be switched on again afterwards
    shell.run_cell("x = 2")
    assert len(reports) == 1


def test_a_cuda_pin_without_cuda_started_reports_host_memory_and_starts_nothing(
        shell, reports, monkeypatch):
    import torch

    monkeypatch.setattr(watch, "_pinned_device", lambda: torch.device("cuda", 0))
    watch.start(shell)
    shell.run_cell("y = 3")
    (report,) = reports
    assert report.device == "cpu" and "CUDA not started" in repr(report)
    assert not torch.cuda.is_initialized()


def test_html_and_text_forms():
    report = watch.CellMemory("cuda:0", "CUDA allocated", 3 * 2**30, -MIB, 2**30, True, 1.5)
    text = repr(report)
    assert "cuda:0" in text and "3.0 GiB" in text and "-1.0 MiB" in text
    assert text in report._repr_html_().replace("&gt;", ">")


@pytest.mark.gpu
def test_cuda_allocator_figures_on_a_gpu(shell, reports):
    shell.run_cell("import torch; torch.zeros(1, device='cuda')")  # the user starts CUDA
    watch.start(shell)
    shell.run_cell("big = torch.ones(64 * 2**20 // 4, device='cuda'); t = torch.ones_like(big); del t")
    (report,) = reports
    assert report.kind == "CUDA allocated"
    assert 63 * MIB < report.net < 65 * MIB and report.peak >= report.now + 63 * MIB
    shell.run_cell("del big")


def test_the_magic_switches_it_and_unload_ext_removes_it(shell, reports):
    before = list(_callbacks(shell))
    shell.run_line_magic("load_ext", "singlecard_nb")
    try:
        shell.run_line_magic("singlecard", "watch on")
        shell.run_cell("z = 1")
        assert len(reports) == 1 and watch.is_watching(shell)
        shell.run_line_magic("singlecard", "watch off")
        shell.run_cell("z = 2")
        assert len(reports) == 1
        shell.run_line_magic("singlecard", "watch on")
    finally:
        shell.run_line_magic("unload_ext", "singlecard_nb")
    assert _callbacks(shell) == before and not watch.is_watching(shell)


class FakeAllocator:
    """torch.cuda's memory counters on a machine without a GPU: what a cell allocates and frees."""

    def __init__(self, allocated: int, peak: int):
        self.allocated, self.peak, self.resets = allocated, peak, 0

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def free(self, n: int) -> None:
        self.allocated -= n

    def memory_allocated(self, device=None) -> int:
        return self.allocated

    def max_memory_allocated(self, device=None) -> int:
        return self.peak

    def reset_peak_memory_stats(self, device=None) -> None:
        self.resets += 1
        self.peak = self.allocated


def test_cuda_peaks_leave_the_users_peak_counters_alone(shell, reports, monkeypatch):
    import torch

    fake = FakeAllocator(allocated=10 * MIB, peak=500 * MIB)  # the user's earlier peak: 500 MiB
    for name in ("memory_allocated", "max_memory_allocated", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(watch, "_torch_cuda_started", lambda: True)
    monkeypatch.setattr(watch, "_pinned_device", lambda: torch.device("cuda", 0))
    shell.user_ns["fake"] = fake
    watch.start(shell)
    # below the earlier peak: the peak is sampled (a lower bound), and said why, once
    shell.run_cell("import time; fake.alloc(100 * 2**20); time.sleep(0.2); fake.free(100 * 2**20)")
    shell.run_cell("fake.alloc(20 * 2**20); time.sleep(0.2); fake.free(20 * 2**20)")
    # a new high: exact, from the allocator's own counter
    shell.run_cell("fake.alloc(600 * 2**20); fake.free(590 * 2**20)")
    below, again, high = reports
    assert fake.resets == 0 and fake.peak == 610 * MIB  # the user's counter reads what it read
    assert below.kind == "CUDA allocated" and not below.peak_exact
    assert below.peak >= 110 * MIB and "(sampled)" in repr(below)
    assert "torch's peak counters are left as they are" in repr(below)
    assert not again.peak_exact and again.peak >= 30 * MIB and "left as they are" not in repr(again)
    assert high.peak_exact and high.peak == 610 * MIB and high.net == 10 * MIB
