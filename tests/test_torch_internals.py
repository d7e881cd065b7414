"""docs/torch_internals.md is the one list of the torch internals the package relies on: every
private name the code reads is on it, at the files that read it."""

from __future__ import annotations

import re
from pathlib import Path

import singlecard_nb

PACKAGE = Path(singlecard_nb.__file__).parent
PAGE = (PACKAGE.parent / "docs" / "torch_internals.md").read_text()
# Private torch names the code reads (attributes of torch objects starting with "_"), as the
# page names them; each with a pattern that finds it in the code.
INTERNALS = {
    "_global_forward_hooks_with_kwargs": r"_global_forward_hooks_with_kwargs",
    "_call_impl.__code__": r"_call_impl\.__code__",
    "_global_forward_pre_hooks": r"_global_forward_pre_hooks",
    "module._forward_hooks": r"\._forward_hooks\b",
    "module._compiled_call_impl": r"_compiled_call_impl",
    "model._orig_mod": r"_orig_mod\b",
    "tensor._version": r"\._version\b",
    "_current_graph_task_id": r"_current_graph_task_id",
    "torch._dynamo": r"torch\._dynamo",
    "_GLOBAL_DEVICE_CONTEXT": r"_GLOBAL_DEVICE_CONTEXT",
    "torch.cuda._lazy_init": r"_lazy_init\b",
    "_world.pg_map": r"\bpg_map\b",
    "reducer._remove_autograd_hooks()": r"_remove_autograd_hooks",
    "_clear_sharding_prop_cache()": r"_clear_sharding_prop_cache",
    "_get_builtin_table()": r"_get_builtin_table",
    "_push_saved_tensors_default_hooks": r"_push_saved_tensors_default_hooks",
    "FakeTensorMode": r"FakeTensorMode",
    "Optimizer._optimizer_step_code": r"_optimizer_step_code",
    "Optimizer.profile_hook_step": r"profile_hook_step",
}


def _files_using(pattern: str) -> set[str]:
    return {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
            if re.search(pattern, path.read_text())}


def _row(name: str) -> str:
    rows = [line for line in PAGE.splitlines() if line.startswith("|") and name in line]
    assert rows, f"{name} is used by singlecard_nb but not listed in docs/torch_internals.md"
    return rows[0]


def test_every_private_torch_name_is_listed_where_it_is_used():
    for name, pattern in INTERNALS.items():
        files = _files_using(pattern)
        assert files, f"{name} is listed but no longer used: take its row off the page"
        row = _row(name)
        listed = set(re.findall(r"`((?:\w+/)*\w+\.py)`", row))
        assert files <= listed, f"{name}: used in {sorted(files - listed)}, not in its row"


def test_no_private_torch_attribute_goes_unlisted():
    # torch._X / torch.<sub>._X read anywhere in the package must be one of the names above
    found = set()
    for path in PACKAGE.rglob("*.py"):
        found |= set(re.findall(r"torch(?:\.\w+)*?\.(_[A-Za-z]\w*)", path.read_text()))
    known = {"_C", "_dynamo", "_GLOBAL_DEVICE_CONTEXT", "_lazy_init", "_efficientzerotensor",
             "_neg_view", "_builtins", "_get_builtin_table", "_tools", "__config__",
             "__version__", "__file__"}
    listed = {m for m in found if m in PAGE}
    assert found - known - listed == set(), f"unlisted torch internals: {found - known - listed}"
