"""Device references follow the pin: .to/.cuda, factories, torch.load, set_device, cuda.device."""

from __future__ import annotations

import importlib.util
import io
import warnings

import pytest
import torch
from parallel_support import clean_state  # noqa: F401 - used by every test (pytestmark)
from torch import nn

from singlecard_nb import session
from singlecard_nb.notices import Notices
from singlecard_nb.parallel import remap
from singlecard_nb.parallel import single_card as parallel
from singlecard_nb.pinning.torch_side import forget_empty_default_device

CPU = torch.device("cpu")
HAS_CUDA = torch.cuda.is_available()  # never on the CI box; only decides what "natively" means

pytestmark = [pytest.mark.usefixtures("clean_state"),
              pytest.mark.filterwarnings("ignore:singlecard_nb. :UserWarning")]


def on_cpu(*tensors: torch.Tensor) -> bool:
    return all(t.device == CPU for t in tensors)


@pytest.mark.skipif(HAS_CUDA, reason="shows what a machine without CUDA does natively")
def test_without_single_card_mode_cuda_references_fail_here():
    with pytest.raises((RuntimeError, AssertionError)):
        torch.ones(1).to(0)
    with pytest.raises((RuntimeError, AssertionError)):
        nn.Linear(1, 1).to(0)
    with pytest.raises((RuntimeError, AssertionError)):
        torch.zeros(1, device="cuda:1")


def test_to_and_cuda_in_every_form_land_on_the_cpu():
    parallel.enable(CPU)
    t = torch.arange(3.0)
    moved = [t.to(0), t.to("cuda"), t.to("cuda:3"), t.to(torch.device("cuda", 3)),
             t.to(device="cuda:1"), t.to(0, non_blocking=True), t.cuda(), t.cuda(3),
             t.cuda(device=torch.device("cuda", 2))]
    assert on_cpu(*moved) and all(torch.equal(m, t) for m in moved)
    assert t.to(0, torch.float64).dtype == torch.float64  # the other arguments stay
    assert t.to(torch.float16).dtype == torch.float16 and t.to(t).device == CPU  # no device
    model = nn.Linear(2, 2)
    assert model.to(0) is model and model.cuda() is model and model.cuda(1) is model
    model.to("cuda:2", torch.float64)
    assert model.weight.dtype == torch.float64 and on_cpu(model.weight)
    model.to(device=torch.device("cuda", 1))
    storage = t.untyped_storage()
    assert storage.cuda().device == CPU and storage.cuda(3).device == CPU


def test_factory_functions_and_new_tensors_take_the_pinned_device():
    parallel.enable(CPU)
    x = torch.ones(2)
    made = [
        torch.zeros(2, device="cuda:1"), torch.ones(2, device=0), torch.empty(2, device="cuda"),
        torch.randn(2, device=torch.device("cuda", 2)), torch.rand(2, device="cuda:0"),
        torch.arange(3, device="cuda:3"), torch.full((2,), 7.0, device="cuda"),
        torch.tensor([1.0], device="cuda:1"), torch.as_tensor([1.0], device="cuda"),
        torch.eye(2, device="cuda"), torch.linspace(0, 1, 3, device="cuda"),
        torch.randint(0, 5, (2,), device="cuda"), torch.randperm(3, device="cuda"),
        torch.zeros_like(x, device="cuda:1"), torch.randn_like(x, device="cuda"),
        x.new_zeros(2, device="cuda:3"), x.new_ones(2, device=1), x.new_empty(2, device="cuda"),
        x.new_full((2,), 1.0, device="cuda"), x.new_tensor([1.0], device="cuda:2"),
    ]
    assert on_cpu(*made)
    assert torch.full((2,), 7.0, device="cuda").tolist() == [7.0, 7.0]  # values untouched
    torch.set_default_device("cuda")
    try:
        assert torch.ones(1).device == CPU
    finally:
        torch.set_default_device(None)
        forget_empty_default_device()  # torch 2.6-2.7 read its None as an error


def test_device_contexts_still_work_after_single_card_mode_is_given_back():
    from torch.utils import _device

    _device._device_constructors.cache_clear()  # as in a fresh process: torch fills it on first use
    parallel.enable(CPU)
    torch.set_default_device("cuda")
    assert torch.ones(1).device == CPU  # a device context's first factory: torch fills its cache
    torch.set_default_device(None)
    forget_empty_default_device()  # torch 2.6-2.7 read its None as an error
    parallel.disable()
    with torch.device("meta"):
        assert torch.empty(2).is_meta and nn.Linear(2, 2).weight.is_meta


def test_torchscript_still_compiles_code_that_calls_a_factory(tmp_path):
    # torch.distributed.optim scripts such code when first imported: it must not break.
    (tmp_path / "scripted_make.py").write_text(
        "import torch\n\n\ndef make(n: int):\n    return torch.zeros(n) + torch.ones(n)\n")
    spec = importlib.util.spec_from_file_location("scripted_make", tmp_path / "scripted_make.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    parallel.enable(CPU)
    assert torch.jit.script(module.make)(2).tolist() == [1.0, 1.0]


# --- torch.load -------------------------------------------------------------------------------
def _checkpoint(monkeypatch, tag: str | None = None) -> bytes:
    """A checkpoint whose storages say they were saved on `tag` (e.g. "cuda:3")."""
    if tag is not None:
        monkeypatch.setattr(torch.serialization, "location_tag", lambda storage: tag)
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(4.0), "step": 3}, buffer)
    monkeypatch.undo()
    return buffer.getvalue()


def _load(data: bytes, **kwargs):
    return torch.load(io.BytesIO(data), **kwargs)


def test_torch_load_map_location_in_every_form_lands_on_the_cpu(monkeypatch):
    cpu_saved = _checkpoint(monkeypatch)
    gpu_saved = _checkpoint(monkeypatch, "cuda:3")
    if not HAS_CUDA:
        with pytest.raises(RuntimeError):
            _load(gpu_saved)  # torch: "Attempting to deserialize object on a CUDA device"
        with pytest.raises((RuntimeError, AssertionError)):
            _load(cpu_saved, map_location="cuda:0")
    parallel.enable(CPU)
    forms = ["cuda:0", "cuda", torch.device("cuda", 1), 0, {"cuda:3": "cuda:0"},
             {"cpu": "cuda:1"}, lambda storage, location: storage.cuda(2),
             lambda storage, location: None, None]
    for data in (cpu_saved, gpu_saved):
        for form in forms:
            loaded = _load(data, map_location=form)
            assert on_cpu(loaded["w"]) and loaded["w"].tolist() == [0, 1, 2, 3], form
            assert loaded["step"] == 3
    assert _load(gpu_saved, weights_only=True)["w"].device == CPU
    locations = []
    _load(gpu_saved, map_location=lambda storage, location: locations.append(location))
    assert locations == ["cuda:3"]  # the user's function sees where it was saved


# --- set_device / cuda.device -----------------------------------------------------------------
def test_set_device_and_the_device_context_are_harmless_on_the_cpu():
    parallel.enable(CPU)
    torch.cuda.set_device(3)
    with torch.cuda.device(3):
        x = torch.ones(1, device="cuda")
    with torch.cuda.device(torch.device("cuda", 1)), torch.cuda.device_of(x):
        pass
    assert on_cpu(x)


def test_set_device_and_the_device_context_select_the_pinned_card(monkeypatch):
    selected = []
    monkeypatch.setattr(torch.cuda, "set_device", selected.append)  # the "original"
    parallel.enable(torch.device("cuda", 2))  # a soft pin to the third card
    torch.cuda.set_device(0)
    torch.cuda.set_device(torch.device("cuda", 5))
    assert selected == [2, 2]
    assert torch.cuda.device(0).idx == 2 and torch.cuda.device(2).idx == 2
    assert torch.cuda.device(None).idx in (None, -1)  # selects nothing, as torch has it


# --- where each reference goes under each pin -------------------------------------------------
@pytest.mark.parametrize(("pinned", "requested", "expected"), [
    # hard GPU pin: the card is cuda:0; only other ordinals need to change
    ("cuda:0", 0, None), ("cuda:0", "cuda", None), ("cuda:0", "cuda:0", None),
    ("cuda:0", torch.device("cuda", 0), None), ("cuda:0", 3, "cuda:0"),
    ("cuda:0", "cuda:3", "cuda:0"), ("cuda:0", torch.device("cuda", 3), "cuda:0"),
    # soft pin to cuda:2: every other ordinal, 0 included; "cuda" is the current device (2)
    ("cuda:2", 0, "cuda:2"), ("cuda:2", "cuda:0", "cuda:2"), ("cuda:2", "cuda", None),
    ("cuda:2", 2, None),
    # the cpu: every CUDA reference
    ("cpu", 0, "cpu"), ("cpu", "cuda", "cpu"), ("cpu", "cuda:7", "cpu"),
    # never a device reference, or not a CUDA one
    ("cpu", "cpu", None), ("cpu", "meta", None), ("cpu", True, None), ("cpu", [0], None),
    ("cpu", torch.float16, None), ("cuda:0", "mps", None), ("cpu", "nonsense", None),
])
def test_where_a_reference_goes(pinned, requested, expected):
    remapper = remap.Remapper(torch.device(pinned), Notices())
    got = remapper.target(requested)
    assert (None if got is None else str(got)) == expected
    assert remapper.target(requested) == got  # memoised, same answer


# --- said once per kind, counted in status ----------------------------------------------------
def test_each_kind_is_said_once_and_counted_in_status():
    session.pin("cpu")
    try:
        t = torch.ones(1)
        with pytest.warns(UserWarning, match=r"tensor.to\(0\) uses cpu, and so will every"):
            t.to(0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            t.to("cuda:1")  # the same kind: counted, not said again
            nn.Linear(1, 1).to(2)
        with pytest.warns(UserWarning, match=r"torch.zeros\(..., device='cuda:1'\) uses cpu"):
            torch.zeros(1, device="cuda:1")
        text = repr(session.status())
        assert "tensor.to(0) uses cpu" in text and "(×3)" in text  # t.to twice, module.to
        assert "torch.zeros(..., device='cuda:1') uses cpu" in text
    finally:
        session.release()


# --- on a real GPU ----------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_pin_sends_every_other_ordinal_to_the_pinned_card(tmp_path):
    card = torch.device("cuda", 0)
    parallel.enable(card)  # as a hard pin (the card is cuda:0), also on a one-GPU machine
    t = torch.ones(2)
    assert t.to(3).device == card and t.cuda(5).device == card and t.to("cuda:7").device == card
    assert torch.zeros(1, device="cuda:4").device == card
    model = nn.Linear(2, 2).to(6)
    assert model.weight.device == card
    torch.save({"w": t.to(0)}, tmp_path / "c.pt")
    assert torch.load(tmp_path / "c.pt", map_location="cuda:3")["w"].device == card
    torch.cuda.set_device(5)
    with torch.cuda.device(4):
        assert torch.cuda.current_device() == 0
