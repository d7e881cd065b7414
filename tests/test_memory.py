"""memory=True: mem_saved is what autograd really saved (counted independently by walking the
graph's saved tensors), mem_out the output's storage, insp.memory() what each module holds."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import singlecard_nb as scn


def saved_by_graph(root: torch.Tensor, model: nn.Module) -> int:
    """Bytes of the distinct storages the graph behind `root` saved, parameters and buffers
    left out: read from each node's `_saved_*` attributes (a custom Function's saved_tensors)."""
    resident = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen, total, stack, visited = set(), 0, [root.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        values = [getattr(node, name) for name in dir(node) if name.startswith("_saved_")]
        values += list(getattr(node, "saved_tensors", ()) or ())
        for value in values:
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, torch.Tensor):
                    storage = t.untyped_storage()
                    key = storage.data_ptr()
                    if key and key not in seen and key not in resident:
                        seen.add(key)
                        total += storage.nbytes()
        stack.extend(next_node for next_node, _ in node.next_functions)
    return total


class Attention(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.out(y.transpose(1, 2).reshape(b, t, c))


class Blocks(nn.Module):
    def __init__(self, reentrant: bool):
        super().__init__()
        self.reentrant = reentrant
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
                                    for _ in range(3))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            x = checkpoint(block, x, use_reentrant=self.reentrant) if i % 2 == 0 else block(x)
        return self.head(x)


def _cnn(inplace: bool = False):
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=inplace),
                         nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(inplace=inplace),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 10))


CASES = {
    "cnn": (lambda: _cnn(), lambda: torch.randn(4, 3, 16, 16)),
    "inplace_relu": (lambda: _cnn(inplace=True), lambda: torch.randn(4, 3, 16, 16)),
    "sdpa_transformer": (lambda: nn.Sequential(Attention(), Attention(), nn.Linear(32, 8)),
                         lambda: torch.randn(2, 12, 32)),
    "checkpointed": (lambda: Blocks(reentrant=True), lambda: torch.randn(8, 16, requires_grad=True)),
}


def test_mem_saved_is_what_autograd_saved():
    for name, (make, data) in CASES.items():
        torch.manual_seed(0)
        model, x = make(), data()
        with scn.inspect(model, memory=True) as insp:
            out = model(x)
            expected = saved_by_graph(out, model)
            frame = insp.frame()
            out.sum().backward()  # our unpack hook hands autograd what it saved
        saved = frame["mem_saved"].sum()
        assert expected > 0, name
        assert saved == expected, (name, saved, expected)
        outputs = frame[frame.io == "output"]
        assert (outputs["mem_out"] > 0).all(), name
        assert frame[frame.io == "input"]["mem_saved"].isna().all(), name


def test_mem_saved_per_module_and_storage_counted_once():
    torch.manual_seed(0)
    model = _cnn(inplace=True)
    x = torch.randn(4, 3, 16, 16)
    with scn.inspect(model, memory=True) as insp:
        model(x).sum().backward()
    rows = insp.frame().set_index("module")
    conv_out = 4 * 8 * 16 * 16 * 4
    assert rows.loc["0", "mem_saved"] == x.numel() * 4  # the conv saved its input, not its weight
    assert rows.loc["0", "mem_out"] == conv_out
    assert rows.loc["2", "mem_saved"] == conv_out  # ReLU(inplace) saves BN's storage, once
    # Linear saved its input, Flatten's view of the pool's output (the pool saved no output)
    assert rows.loc["7", "mem_saved"] == 4 * 32 * 4 and rows.loc["6", "mem_saved"] == 0


def test_checkpointing_saves_less_and_inplace_errors_still_raise():
    torch.manual_seed(0)
    plain = Blocks(reentrant=True)
    plain.forward = lambda x: plain.head(plain.blocks[2](plain.blocks[1](plain.blocks[0](x))))
    x = torch.randn(8, 16, requires_grad=True)
    with scn.inspect(plain, memory=True) as a:
        plain(x)
    with scn.inspect(Blocks(reentrant=False), memory=True) as b:
        b.model(x)
    assert b.frame()["mem_saved"].sum() < a.frame()["mem_saved"].sum()
    # an in-place change of a saved tensor is still autograd's error under the hooks
    w = torch.randn(8, requires_grad=True)
    model = nn.Sequential(nn.Sigmoid())
    with scn.inspect(model, memory=True):
        y = model(w)
    y.mul_(2)
    try:
        y.sum().backward()
    except RuntimeError as e:
        assert "modified by an inplace operation" in str(e)
    else:
        raise AssertionError("the in-place change went unnoticed")


def test_saved_outputs_are_freed_without_backward():
    import weakref

    model = nn.Sequential(nn.Linear(8, 8), nn.Sigmoid())  # sigmoid saves its own output
    with scn.inspect(model, memory=True):
        y = model(torch.randn(4, 8))
    ref = weakref.ref(y)
    del y
    assert ref() is None  # no cycle between a saved output and its graph


def test_memory_table_by_module_and_totals():
    torch.manual_seed(0)
    model = _cnn()
    opt = torch.optim.Adam(model.parameters())
    insp = scn.inspect(model, memory=True)
    try:
        for _ in range(2):
            model(torch.randn(4, 3, 16, 16)).sum().backward()
            opt.step()
        table = insp.memory()
    finally:
        insp.stop()
    frame = table.frame()
    assert list(frame.columns) == ["module", "type", "parameters", "gradients", "optimizer",
                                   "activations", "outputs", "total"]
    assert frame["total"].is_monotonic_decreasing
    params = sum(p.numel() * 4 for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers())
    assert frame["parameters"].sum() == params
    assert frame["gradients"].sum() == sum(p.grad.numel() * 4 for p in model.parameters())
    assert frame["optimizer"].sum() == sum(v.numel() * v.element_size()
                                           for s in opt.state.values() for v in s.values())
    assert frame["activations"].sum() == insp.last_step()["mem_saved"].sum()
    text = repr(table)
    assert "activations" in text.splitlines()[1] and "Conv2d" in text
    assert "cpu" in table.headline() and "<table" in table._repr_html_()


def test_memory_needs_the_option_and_checks_it():
    model = nn.Linear(2, 2)
    with scn.inspect(model) as insp:
        model(torch.randn(1, 2))
    assert "mem_out" not in insp.frame().columns
    try:
        insp.memory()
    except ValueError as e:
        assert "memory=True" in str(e)
    else:
        raise AssertionError
    try:
        scn.inspect(model, memory="yes")
    except ValueError as e:
        assert "memory must be True or False" in str(e)
    else:
        raise AssertionError


def test_inspect_magic_memory_flag():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "singlecard_nb")
    try:
        ip.user_ns["mm"] = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        ip.run_line_magic("inspect", "mm --memory")
        assert not ip.run_cell("import torch; mm(torch.randn(2, 4))").error_in_exec
        insp = scn.inspector(ip.user_ns["mm"])
        assert insp.frame()["mem_saved"].sum() > 0
        ip.run_line_magic("inspect", "off mm")
    finally:
        ip.run_line_magic("unload_ext", "singlecard_nb")


def _saved_hooks_installed() -> bool:
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:  # torch 2.6 cannot say which saved-tensor hooks are pushed
        pytest.skip(f"torch {torch.__version__} has no way to read autograd's saved-tensor "
                    "hook stack")
    return top(False) is not None


def test_hooks_are_given_back_after_errors_ctrl_c_and_stop():
    from torch.nn.modules import module as module_globals

    class Fails(nn.Module):
        def forward(self, x):
            raise KeyboardInterrupt if x.shape[0] == 3 else ValueError("boom")

    model = nn.Sequential(nn.Linear(4, 4), Fails())
    pre_hooks = dict(module_globals._global_forward_pre_hooks)
    insp = scn.inspect(model, memory=True)
    try:
        try:
            model(torch.randn(2, 4))
        except ValueError:
            pass
        assert not _saved_hooks_installed()  # the root's always-called hook closed the call
        try:
            model(torch.randn(3, 4))  # Ctrl-C: torch runs no always-called hook
        except KeyboardInterrupt:
            pass
        insp.flush()  # what %inspect runs after each cell: the stale call is settled
        assert not _saved_hooks_installed()
        assert dict(module_globals._global_forward_pre_hooks) == pre_hooks
    finally:
        insp.stop()
    assert not _saved_hooks_installed()
    assert dict(module_globals._global_forward_pre_hooks) == pre_hooks
