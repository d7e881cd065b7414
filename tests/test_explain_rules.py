"""The diagnosis rules run in the order of one explicit list, `hints.RULES`, and every rule is in it."""

from __future__ import annotations

import inspect
import pkgutil
import textwrap

from conftest import run_fresh_python
from torch import nn

from singlecard_nb.diagnosis import hints, rules
from singlecard_nb.diagnosis.failure import Failure
from singlecard_nb.diagnosis.rules import code, layers


def traced_linear_failure() -> Failure:
    """A Linear with in_features=3 that torch.compile was tracing: two rules recognise it."""
    return Failure(
        exception=RuntimeError("mat1 and mat2 shapes cannot be multiplied (5x4 and 3x2)"),
        module=nn.Linear(3, 2), path="fc", label="Linear 'fc'", args=(), kwargs={}, inputs=[],
        traced=True)


def test_the_first_rule_in_the_list_that_recognises_the_failure_speaks(monkeypatch):
    failure = traced_linear_failure()
    assert layers.linear_features(failure) and code.traced_by_compile(failure)  # both match
    assert hints.RULES.index(layers.linear_features) < hints.RULES.index(code.traced_by_compile)
    assert hints.diagnose(failure) == layers.linear_features(failure)

    monkeypatch.setattr(hints, "RULES", tuple(reversed(hints.RULES)))  # the list, not the files
    assert hints.diagnose(failure) == code.traced_by_compile(failure)


def test_a_rule_that_does_not_recognise_the_failure_leaves_it_to_the_next(monkeypatch):
    calls = []

    def silent(failure):
        calls.append("silent")

    def first(failure):
        calls.append("first")
        return "first sentence"

    def second(failure):
        calls.append("second")
        return "second sentence"

    monkeypatch.setattr(hints, "RULES", (silent, first, second))
    assert hints.diagnose(traced_linear_failure()) == "first sentence"
    assert calls == ["silent", "first"]  # nothing after the one that spoke runs


def test_every_rule_of_the_rule_modules_is_in_the_list_once():
    modules = {info.name for info in pkgutil.iter_modules(rules.__path__)}
    assert {m.__name__.rpartition(".")[2] for m in hints.RULE_MODULES} == modules
    defined = {fn for module in hints.RULE_MODULES
               for name, fn in inspect.getmembers(module, inspect.isfunction)
               if fn.__module__ == module.__name__ and not name.startswith("_")}
    assert set(hints.RULES) == defined
    assert len(hints.RULES) == len(defined)  # none twice


def test_a_tensor_parallel_attention_on_cpu_ranks_is_said_to_need_gpus():
    # pytorch/examples' tensor_parallelism/fsdp_tp_example.py under `--device cpu`: torch picks
    # SDPA's CPU kernel, which DTensor cannot shard (it can the GPU's); a world of one shows it
    found, _ = run_fresh_python(textwrap.dedent("""
        import json, os, torch
        import torch.distributed as dist
        import torch.nn.functional as F
        from torch import nn
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
        import singlecard_nb as scn
        from singlecard_nb.job import free_port

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
        mesh = init_device_mesh("cpu", (1,))

        class Attention(nn.Module):
            def __init__(self):
                super().__init__()
                self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

            def forward(self, x):
                shape = (2, 4, 2, 4)
                q, k, v = (p(x).view(shape).transpose(1, 2) for p in (self.q, self.k, self.v))
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        model = parallelize_module(Attention(), mesh, {name: ColwiseParallel(use_local_output=False)
                                                       for name in ("q", "k", "v")})
        try:
            model(torch.randn(2, 4, 8))
        except NotImplementedError as e:
            message = str(e)
            hint = scn.explain(e).hint
        dist.destroy_process_group()
        print(json.dumps({"message": message, "hint": hint}))
        """))
    assert "_for_cpu" in found["message"]
    assert found["hint"].startswith("DTensor (tensor parallelism) has no sharding strategy for "
                                    "aten._scaled_dot_product_flash_attention_for_cpu")
    assert "runs on GPUs, not on CPU ranks" in found["hint"]
