"""Fuzz: random nested outputs of every tensor kind pass through an inspected model untouched.

Each example builds a structure (tuples with None, lists, dicts, namedtuples, dataclasses, shared
references) whose leaves are float (with gradients), int, bool, complex, empty, sparse,
quantized, meta and nested tensors, and Python values; the model returns it. Outputs and
gradients must equal an uninspected run's, the inspector must record without failing, and
torch's hook tables must be as they were once it stops.
"""

from __future__ import annotations

import collections
import dataclasses
import warnings

import torch
from conftest import hook_tables
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import singlecard_nb as scn

Pair = collections.namedtuple("Pair", ["left", "right"])


@dataclasses.dataclass
class Output:
    first: object
    second: object = None


with warnings.catch_warnings():
    # torch's notes on nested (prototype) and quantized (deprecated) tensors; made once, as
    # torch takes milliseconds to make one (it formats a stack for each note)
    warnings.simplefilter("ignore", UserWarning)
    NESTED = torch.nested.nested_tensor([torch.ones(2, 3), torch.zeros(1, 3)])
    JAGGED = torch.nested.nested_tensor([torch.ones(3, 1), torch.ones(1, 1)], layout=torch.jagged)
    QUANTIZED = torch.quantize_per_tensor(torch.linspace(-1, 1, 5), 0.1, 0, torch.quint8)

LEAVES = ("float", "float", "float", "int", "bool", "complex", "empty", "sparse", "quantized",
          "meta", "nested", "jagged", "none", "number", "text", "ref", "ref")
specs = st.recursive(
    st.tuples(st.sampled_from(LEAVES), st.integers(0, 50)),
    lambda children: st.one_of(
        st.tuples(st.just("tuple"), st.lists(children, max_size=4)),
        st.tuples(st.just("list"), st.lists(children, max_size=4)),
        st.tuples(st.just("dict"), st.lists(children, max_size=3)),
        st.tuples(st.just("pair"), st.lists(children, min_size=2, max_size=2)),
        st.tuples(st.just("dataclass"), st.lists(children, min_size=1, max_size=2)),
    ),
    max_leaves=14,
)


def build(spec, x: torch.Tensor, w: torch.Tensor, built: list):
    """The structure `spec` describes, from input `x` and parameter `w` (deterministic)."""
    kind, arg = spec
    if kind == "ref":  # a shared reference to something built before
        return built[arg % len(built)] if built else None
    if isinstance(arg, list):
        items = [build(child, x, w, built) for child in arg]
        obj = {"tuple": tuple, "list": list}.get(kind, lambda v: v)(items)
        if kind == "dict":
            obj = {f"k{i}": item for i, item in enumerate(items)}
        elif kind == "pair":
            obj = Pair(*items)
        elif kind == "dataclass":
            obj = Output(*items)
    else:
        scale = 1 + arg / 10
        obj = {
            "float": lambda: x * w * scale,
            "int": lambda: torch.arange(arg % 7),
            "bool": lambda: x > arg / 50,
            "complex": lambda: torch.complex(x, x * scale).detach(),
            "empty": lambda: (x * w)[:0],
            "sparse": lambda: (x.detach() * scale).relu().to_sparse(),
            "quantized": lambda: QUANTIZED,
            "meta": lambda: torch.empty(arg % 4, 2, device="meta"),
            "nested": lambda: NESTED,
            "jagged": lambda: JAGGED,
            "none": lambda: None,
            "number": lambda: arg,
            "text": lambda: str(arg),
        }[kind]()
    built.append(obj)
    return obj


class Returns(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, 3))
        self.inner = nn.Linear(3, 3)

    def forward(self, x):
        return build(self.spec, self.inner(x), self.w, [])


def float_tensors(obj, seen=None) -> list[torch.Tensor]:
    """Float tensors with gradients inside `obj`, each once (the loss of the fuzz model)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj] if obj.requires_grad and obj.layout is torch.strided else []
    if dataclasses.is_dataclass(obj):
        obj = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in float_tensors(item, seen)]
    return []


def tensor_count(obj, seen=None) -> int:
    """Tensors in `obj` by position, containers counted once (as the engine walks them)."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        return 1
    if not isinstance(obj, (list, tuple, dict)) and not dataclasses.is_dataclass(obj):
        return 0
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if dataclasses.is_dataclass(obj):
        obj = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    if isinstance(obj, dict):
        obj = list(obj.values())
    return sum(tensor_count(item, seen) for item in obj)


def same(a, b, seen=None) -> bool:
    seen = set() if seen is None else seen
    if (id(a), id(b)) in seen:
        return True
    seen.add((id(a), id(b)))
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        if a.is_meta or b.is_meta:
            return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
        if a.is_nested:
            return all(torch.equal(p, q) for p, q in zip(a.unbind(), b.unbind()))
        if a.is_quantized:
            return torch.equal(a.int_repr(), b.int_repr())
        if a.layout is not torch.strided:
            return torch.equal(a.to_dense(), b.to_dense())
        return a.dtype == b.dtype and torch.equal(a, b)
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name), seen) for f in dataclasses.fields(a))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], seen) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(p, q, seen) for p, q in zip(a, b))
    return a == b


X = torch.linspace(-1, 1, 6).view(2, 3)


def run(model: nn.Module, x: torch.Tensor):
    model.zero_grad(set_to_none=True)
    out = model(x)
    loss = sum((t.sum() for t in float_tensors(out)), torch.zeros(()))
    if loss.requires_grad:
        loss.backward()
    return out, [None if p.grad is None else p.grad.clone() for p in model.parameters()]


@settings(max_examples=500, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=specs, inputs=st.sampled_from([True, False, "root"]), trap=st.booleans())
def test_random_output_structures_pass_through_untouched(spec, inputs, trap):
    model, x = Returns(spec), X
    bare_out, bare_grads = run(model, x)
    before = hook_tables(model)
    with scn.inspect(model, grads=True, inputs=inputs, trap=trap) as insp:
        out, grads = run(model, x)
    assert same(out, bare_out)
    assert all(g is None and h is None or torch.equal(g, h) for g, h in zip(grads, bare_grads))
    assert insp.errors == []
    assert hook_tables(model) == before
    df = insp.frame()
    assert "inner" in set(df.module)
    rows = df[(df.module == "") & (df.io == "output")]
    assert len(rows) == tensor_count(out)  # every tensor of the output, each container once
