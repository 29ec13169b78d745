"""The layout holds: no import circle, layers and rooms import only downward, the
readers of the command line start without an actor runtime, and production code
never imports the test kit.

Imports are read from the source (the AST), every one of them: at module level,
inside functions, and under ``TYPE_CHECKING`` -- a circle that only a type checker
follows is still a circle a reader has to untangle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("protocol", "store", "supervision", "actors")

#: What each layer, and each room of ``actors``, may import (besides itself).
ALLOWED: dict[str, set[str]] = {
    "subagents.protocol": set(),
    "subagents.store": {"subagents.protocol"},
    "subagents.supervision": {"subagents.protocol"},
    "subagents.actors._kernel": {"subagents.protocol", "subagents.supervision"},
    "subagents.actors._catalog": {"subagents.protocol", "subagents.store"},
    "subagents.actors._agents": {
        "subagents.protocol",
        "subagents.store",
        "subagents.actors._kernel",
    },
    "subagents.actors._children": {
        "subagents.protocol",
        "subagents.store",
        "subagents.supervision",
        "subagents.actors._kernel",
        "subagents.actors._agents",
        "subagents.actors._catalog",
    },
    "subagents.actors._model": {
        "subagents.protocol",
        "subagents.actors._kernel",
        "subagents.actors._agents",
        "subagents.actors._children",
        "subagents.actors._catalog",
    },
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(("subagents", *parts))
            found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[str]:
    """Every module of the package ``name`` imports, resolved to a known module."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" for alias in node.names] + [module]
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target:
                yield target


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        is_package = path.name == "__init__.py"
        edges[name] = {
            t
            for t in _imports(name, path)
            # A module's own package and a package's own modules are its faces, not
            # dependencies (importing a.b.c runs a/__init__ first by necessity).
            if t != name
            and not name.startswith(t + ".")
            and not (is_package and t.startswith(name + "."))
        }
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_the_walk_sees_a_circle_when_there_is_one() -> None:
    """The detector itself: a two-module circle and a self-contained chain."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle_anywhere() -> None:
    edges = _edges()
    assert len(edges) > 60  # the walk found the package
    assert _cycles(edges) == []


def _home(module: str) -> str:
    """The layer or room that ``ALLOWED`` names for ``module``."""
    for key in sorted(ALLOWED, key=len, reverse=True):
        if module == key or module.startswith(key + "."):
            return key
    return module


@pytest.mark.parametrize("home", sorted(ALLOWED))
def test_layers_and_rooms_import_only_downward(home: str) -> None:
    edges = _edges()
    wrong = sorted(
        (name, target)
        for name, targets in edges.items()
        if _home(name) == home
        for target in targets
        if _home(target) != home and _home(target) not in ALLOWED[home]
    )
    assert wrong == []


def test_production_code_never_imports_the_test_kit() -> None:
    kit = "subagents.actors.testing"
    edges = _edges()
    assert sorted(n for n, targets in edges.items() if kit in targets and n != kit) == []


def test_the_readers_start_without_an_actor_runtime(tmp_path: Path) -> None:
    """``subagents tree`` and ``show`` import neither pykka nor gevent."""
    from subagents.actors import Runtime

    db = tmp_path / "s.db"
    with Runtime(str(db)) as rt:
        root = rt.spawn("echo", label="root")
        root.followup("hi")
        assert root.wait_idle(10)
        sid = str(root.session_id)
    code = f"""
import contextlib, io, sys
from subagents.actors._shell._cli import main
with contextlib.redirect_stdout(io.StringIO()):
    assert main(["tree", {str(db)!r}]) == 0
    assert main(["tree", {str(db)!r}, "--json"]) == 0
    assert main(["show", {str(db)!r}, {sid!r}]) == 0
    assert main(["show", {str(db)!r}, {sid!r}, "--json"]) == 0
print(sorted(m for m in sys.modules if m.split(".")[0] in ("pykka", "gevent", "greenlet")))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
