"""The folder layout is the architecture: imports run one way, and no wing imports another.

notebook/, cli  ->  session  ->  wings (pinning/, parallel/, inspection/, diagnosis/, sizing/, ranks/)  ->  borrow
Every import counts, also the ones inside functions (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import types
from pathlib import Path

import pytest

import singlecard_nb

PACKAGE = Path(singlecard_nb.__file__).parent
WINGS = ("pinning", "parallel", "inspection", "diagnosis", "sizing", "ranks")
GROUND_FLOOR = ("borrow", "capacity", "dtype_limits", "dtypes", "errors", "frames", "job", "notices",
                "theme")  # import nothing of ours; every layer may import them

# The inspection wing's rooms, and the rooms each may import (its own always). `shared` is the
# wing's own floor (options, targets, diagnostics: what every room speaks of); the `facade`
# (engine: the Inspector) ties the rooms; `finding` (inspect_all) builds inspectors,
# so it sits above the facade.
INSPECTION_SHARED = ("options", "targets", "diagnostics")
INSPECTION_FACADE = ("engine",)
INSPECTION_ROOMS = {
    "finding": {"facade", "recording", "shared"},
    "facade": {"recording", "kernel", "memory", "views", "causes", "runs", "shared"},
    "recording": {"kernel", "memory", "shared"},
    "memory": {"shared"},
    "views": {"causes", "shared"},  # works from recorded rows, never from the recording machinery
    "causes": set(),  # the ranking's rules: plain Python over recorded series
    "runs": {"views", "causes", "shared"},  # frames and record files only: nothing of a live recording
    "kernel": set(),
    "shared": set(),
    "face": set(),  # inspection/__init__.py
}


# Rooms with a face: code outside the room imports the room (its __init__) and only names its
# `__all__` lists, never one of its files. Every room of inspection/ has one.
FACED_ROOMS = ("recording", "kernel", "memory", "causes", "views", "runs", "finding")

# Module names used twice, each on purpose: only where one name means one concept in two wings.
# None is now: each pair once named two concepts (module calls counted / on a traceback, bytes
# recorded / estimated, a pin's plan / fit's Plan, ...) and one of each was renamed, so a name
# says one thing wherever a reader meets it.
SAME_NAME_ON_PURPOSE: dict[str, set[str]] = {}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Modules of singlecard_nb that `path` imports anywhere in its code."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:  # `from . import borrow` imports the submodule borrow
                submodule = f"{module}.{alias.name}"
                found.add(submodule if _exists(submodule) else module)
    return {m for m in found if m.startswith("singlecard_nb") and _exists(m)}


def _exists(module: str) -> bool:
    relative = Path(*module.split(".")[1:])
    return ((PACKAGE / relative).with_suffix(".py").exists()
            or (PACKAGE / relative / "__init__.py").exists())


def _layer(module: str) -> tuple[int, str]:
    """(layer, room): higher layers may import lower ones; one room may import itself."""
    parts = module.split(".")
    if module == "singlecard_nb":
        return 4, "top"
    room = parts[1]
    if room == "notebook":
        return 3, room
    if room in ("cli", "__main__"):  # the terminal's face, beside the notebook layer
        return 3, "cli"
    if room == "session":
        return 2, room
    if room in WINGS:
        return 1, room
    if room in GROUND_FLOOR:
        return 0, room
    raise AssertionError(f"{module} is in no room of the layout; add it to a wing or a layer")


def _graph() -> dict[str, set[str]]:
    return {_module_name(path): _imports(path) for path in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_lives_in_a_known_room():
    rooms = {_layer(module)[1] for module in _graph()}
    assert rooms == {"top", "notebook", "cli", "session", *WINGS, *GROUND_FLOOR}


def test_imports_run_one_way_and_no_wing_imports_another():
    bad = []
    for module, imported in _graph().items():
        layer, room = _layer(module)
        for other in imported:
            other_layer, other_room = _layer(other)
            if other_room == "top" and module != "singlecard_nb":
                bad.append(f"{module} imports the package top ({other})")
            elif room in WINGS and other_room in WINGS and other_room != room:
                bad.append(f"wing {module} imports another wing: {other}")
            elif other_room == "notebook" and room not in ("notebook", "top"):
                bad.append(f"{module} imports the notebook layer from below: {other}")
            elif other_layer > layer:
                bad.append(f"{module} (layer {layer}) imports {other} (layer {other_layer})")
    assert not bad, "\n".join(bad)


def _inspection_room(module: str) -> str:
    parts = module.split(".")[2:]
    if not parts:
        return "face"
    if parts[0] in INSPECTION_SHARED:
        return "shared"
    if parts[0] in INSPECTION_FACADE:
        return "facade"
    if parts[0] in INSPECTION_ROOMS:
        return parts[0]
    raise AssertionError(f"{module} is in no room of inspection/; add it to INSPECTION_ROOMS")


def test_the_inspection_rooms_import_one_way():
    bad = []
    for module, imported in _graph().items():
        if not module.startswith("singlecard_nb.inspection"):
            continue
        room = _inspection_room(module)
        for other in imported:
            if not other.startswith("singlecard_nb.inspection"):
                continue
            other_room = _inspection_room(other)
            if other_room != room and other_room not in INSPECTION_ROOMS[room]:
                bad.append(f"inspection room {room} ({module}) imports {other_room} ({other})")
    assert not bad, "\n".join(bad)


def test_every_inspection_module_is_in_a_room():
    rooms = {_inspection_room(m) for m in _graph() if m.startswith("singlecard_nb.inspection")}
    assert rooms == set(INSPECTION_ROOMS)


def test_the_checker_sees_a_view_importing_the_recording(tmp_path, monkeypatch):
    fake = tmp_path / "singlecard_nb"
    for room in ("inspection/views", "inspection/recording"):
        (fake / room).mkdir(parents=True)
        (fake / room / "__init__.py").write_text("")
    for path in ("__init__.py", "inspection/__init__.py", "inspection/recording/store.py"):
        (fake / path).write_text("")
    (fake / "inspection" / "views" / "live.py").write_text("from ..recording import store\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    with pytest.raises(AssertionError, match="room views .* imports recording"):
        test_the_inspection_rooms_import_one_way()


def test_the_ground_floor_imports_nothing_of_ours():
    # a ground-floor package (borrow/) may import its own modules, nothing else of ours
    graph = _graph()
    for room in GROUND_FLOOR:
        own = f"singlecard_nb.{room}"
        modules = [m for m in graph if m == own or m.startswith(own + ".")]
        assert modules, room
        for module in modules:
            outside = {m for m in graph[module] if m != own and not m.startswith(own + ".")}
            assert outside == set(), (module, outside)


def test_there_are_no_import_circles():
    graph = {m: {o for o in imported if o != m} for m, imported in _graph().items()}
    state: dict[str, int] = {}  # 1 visiting, 2 done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for other in sorted(graph.get(module, ())):
            if other.startswith(module + ".") or module.startswith(other + "."):
                continue  # a package and its own submodules
            if state.get(other) == 1:
                cycle = path[path.index(other):] + [other]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if other not in state:
                visit(other)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_the_checker_sees_a_wing_importing_another(tmp_path, monkeypatch):
    # The rules above must be able to fail: a planted wing-to-wing import is found.
    fake = tmp_path / "singlecard_nb"
    (fake / "inspection").mkdir(parents=True)
    (fake / "pinning").mkdir()
    for path in ("__init__.py", "inspection/__init__.py", "pinning/__init__.py",
                 "pinning/pinning.py"):
        (fake / path).write_text("")
    (fake / "inspection" / "engine.py").write_text("from ..pinning import pinning\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    with pytest.raises(AssertionError, match="imports another wing"):
        test_imports_run_one_way_and_no_wing_imports_another()


def test_public_names_are_not_shadowed_by_subpackages():
    # Importing every submodule sets package attributes; none may replace a public function
    # (a wing called `pin/` once made `singlecard_nb.pin` a module).
    for info in pkgutil.walk_packages([str(PACKAGE)], "singlecard_nb."):
        importlib.import_module(info.name)
    for name in singlecard_nb.__all__:
        assert not isinstance(getattr(singlecard_nb, name), types.ModuleType), name


def _architecture_map() -> set[str]:
    """The module paths docs/ARCHITECTURE.md's map names: each line of its `text` block is a
    folder of singlecard_nb/ and the modules in it."""
    page = (PACKAGE.parent / "docs" / "ARCHITECTURE.md").read_text()
    block = page.split("## Where each module lives", 1)[1].split("```text\n", 1)[1]
    named = set()
    for line in block.split("```", 1)[0].splitlines():
        folder, *modules = line.split()
        prefix = "" if folder == "./" else folder
        named.update(f"{prefix}{module}" for module in modules)
    return named


def test_every_module_is_on_the_architecture_page_and_nothing_else():
    # docs/ARCHITECTURE.md is where a newcomer looks a module up: by its whole path, so a
    # second module of one name is placed too, and a module removed leaves the page
    modules = {_relative(name) for name in _graph() if name.count(".") >= 1
               and not (PACKAGE / _relative(name) / "__init__.py").exists()}
    named = _architecture_map()
    assert not modules - named, f"not on docs/ARCHITECTURE.md: {sorted(modules - named)}"
    assert not named - modules, f"on docs/ARCHITECTURE.md, no module: {sorted(named - modules)}"



def _room_of(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "inspection" and parts[2] in INSPECTION_ROOMS:
        return parts[2]
    return None


def _face_breaches() -> list[str]:
    """Imports, from outside a faced room, of one of its files or of a name its face does not
    export."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        room = _room_of(module)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                target, names = "", []
                for alias in node.names:
                    if _room_of(alias.name) in FACED_ROOMS and alias.name.count(".") > 2:
                        bad.append(f"{module} imports {alias.name}")
                continue
            else:
                continue
            faced = _room_of(target)
            if faced not in FACED_ROOMS or room == faced:
                continue
            face = f"singlecard_nb.inspection.{faced}"
            if target != face:
                bad.append(f"{module} imports {target}, not the face {face}")
                continue
            exported = _exported(face)
            bad += [f"{module} imports {name} from {face}, which its __all__ does not list"
                    for name in names if name not in exported]
    return bad


def _exported(face: str) -> set[str]:
    init = PACKAGE.joinpath(*face.split(".")[1:], "__init__.py")
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def test_code_outside_a_room_imports_its_face():
    breaches = _face_breaches()
    assert not breaches, "\n".join(breaches)


def test_each_face_exports_what_it_names():
    for room in FACED_ROOMS:
        face = importlib.import_module(f"singlecard_nb.inspection.{room}")
        assert face.__all__ and all(hasattr(face, name) for name in face.__all__), room
        assert _exported(face.__name__) == set(face.__all__), room
        for name in face.__all__:  # `from room import heatmap` must keep giving the file
            if (PACKAGE / "inspection" / room / f"{name}.py").exists():
                assert isinstance(getattr(face, name), types.ModuleType), (room, name)


def test_the_checker_sees_a_deep_import_into_a_faced_room(tmp_path, monkeypatch):
    fake = tmp_path / "singlecard_nb"
    (fake / "inspection" / "runs").mkdir(parents=True)
    (fake / "cli").mkdir()
    for path in ("__init__.py", "inspection/__init__.py", "cli/__init__.py",
                 "inspection/runs/recorded.py"):
        (fake / path).write_text("")
    (fake / "inspection" / "runs" / "__init__.py").write_text('__all__ = ["load"]\n')
    (fake / "cli" / "at_exit.py").write_text(
        "from ..inspection.runs.recorded import load\nfrom ..inspection.runs import save\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    breaches = _face_breaches()
    assert any("imports singlecard_nb.inspection.runs.recorded, not the face" in b
               for b in breaches), breaches
    assert any("imports save from singlecard_nb.inspection.runs, which its __all__" in b
               for b in breaches), breaches


def _relative(module: str) -> str:
    return "/".join(module.split(".")[1:])


def test_a_module_name_is_used_once_unless_named_on_purpose():
    by_name: dict[str, set[str]] = {}
    for module in _graph():
        if module.count(".") >= 1 and not (PACKAGE / _relative(module) / "__init__.py").exists():
            by_name.setdefault(module.rsplit(".", 1)[1], set()).add(_relative(module))
    twice = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert twice == SAME_NAME_ON_PURPOSE, (
        "a module name used twice must be named in SAME_NAME_ON_PURPOSE (or renamed): "
        f"{twice}")
