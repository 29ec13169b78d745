"""The docs stay true: the tutorial runs, every public name and error code is documented."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from subagents.protocol import ErrorCode

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_tutorial_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    try:
        for block in _blocks(DOCS / "tutorial.md"):
            exec(compile(block, "tutorial.md", "exec"), namespace)
    finally:
        rt = namespace.get("rt")
        if rt is not None:
            rt.close()  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    assert "hello, world" in out and "QUIET PLEASE" in out and "stop_reason='completed'" in out
    assert "1 hello again, world" in out  # a restart: resumed by recorded model, sent once
    assert "steered\n" in out and "plan the trip (+ and book a hotel)" in out


def test_observability_guide_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """docs/observability.md's example prints what the page says it prints."""
    monkeypatch.chdir(tmp_path)
    (block,) = _blocks(DOCS / "observability.md")
    exec(compile(block, "observability.md", "exec"), {})
    first, percentiles, last = capsys.readouterr().out.splitlines()
    assert (first, last) == ("6 6 1 0 0", "1 1 6")
    assert percentiles.startswith("p50 ") and " ms, p99 " in percentiles


def test_backpressure_guide_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """docs/backpressure.md's example prints what the page says it prints."""
    monkeypatch.chdir(tmp_path)
    (block,) = _blocks(DOCS / "backpressure.md")
    exec(compile(block, "backpressure.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["INBOX_FULL 2 2", "2"]


def test_tracing_guide_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """docs/tracing.md's example prints the span tree the page shows."""
    monkeypatch.chdir(tmp_path)
    page = (DOCS / "tracing.md").read_text()
    (block,) = _blocks(DOCS / "tracing.md")
    exec(compile(block, "tracing.md", "exec"), {})
    shown = page.split("prints\n\n```text\n", 1)[1].split("```", 1)[0]
    assert capsys.readouterr().out == shown


def test_readme_script_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (block,) = _blocks(ROOT / "README.md")
    exec(compile(block, "README.md", "exec"), {})
    assert "TurnEnd" in capsys.readouterr().out


def test_every_public_name_is_in_the_api_reference() -> None:
    api = (DOCS / "api.md").read_text()
    missing = []
    for module_name in (
        "subagents.protocol",
        "subagents.store",
        "subagents.actors",
        "subagents.actors.testing",
        "subagents.supervision",
    ):
        module = importlib.import_module(module_name)
        assert len(set(module.__all__)) == len(module.__all__), module_name
        for name in module.__all__:
            assert hasattr(module, name), (module_name, name)
            if f"### `{name}" not in api:
                missing.append(f"{module_name}.{name}")
    assert not missing, f"run `python docs/gen_api.py`; undocumented: {missing}"


def test_every_error_code_is_in_the_table() -> None:
    table = (DOCS / "errors.md").read_text()
    codes = [v for k, v in vars(ErrorCode).items() if k.isupper()]
    assert codes
    assert [c for c in codes if f"`{c}`" not in table] == []


# -- the API reference is complete and reproducible (issue 17 point 3) -----------------

PUBLIC_MODULES = (
    "subagents.protocol",
    "subagents.store",
    "subagents.actors",
    "subagents.actors.testing",
    "subagents.supervision",
)


def _gen_api() -> Any:
    spec = importlib.util.spec_from_file_location("gen_api", DOCS / "gen_api.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_api_reference_is_current() -> None:
    """docs/api.md is what ``python docs/gen_api.py`` writes now: a changed public name,
    signature or docstring without regenerating it fails here."""
    assert (DOCS / "api.md").read_text() == _gen_api().render(), "run `python docs/gen_api.py`"


def test_the_api_reference_is_reproducible() -> None:
    """Two generations in fresh interpreters with different hash seeds (set order,
    addresses) are byte-identical."""
    outputs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        code = "import runpy, sys; m = runpy.run_path(sys.argv[1]); sys.stdout.write(m['render']())"
        proc = subprocess.run(
            [sys.executable, "-c", code, str(DOCS / "gen_api.py")],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1]


def test_every_public_member_is_documented() -> None:
    """Every method and property of a public class has a summary line in api.md
    (signatures are always there)."""
    undocumented = [
        line for line in _gen_api().render().splitlines() if line.endswith(("`:", "(property):"))
    ]
    assert undocumented == []


def _classes_in(annotation: Any, found: set[type]) -> None:
    if inspect.isclass(annotation):
        found.add(annotation)
    for arg in typing.get_args(annotation):
        _classes_in(arg, found)


def test_every_type_a_public_call_returns_is_exported() -> None:
    """A public call never hands out a type its user cannot import (or name in an
    annotation): each project class in a return annotation is in some ``__all__``."""
    namespace: dict[str, Any] = {}
    exported: set[int] = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            namespace[name] = getattr(module, name)
            exported.add(id(namespace[name]))
    import pykka._future
    import pykka._types

    namespace.update(vars(pykka._types))
    namespace.update(vars(pykka._future))
    functions: list[tuple[str, Any]] = []
    for name, obj in list(namespace.items()):
        if id(obj) not in exported:
            continue
        if inspect.isfunction(obj):
            functions.append((name, obj))
        elif inspect.isclass(obj):
            for klass in obj.__mro__:
                if not klass.__module__.startswith("subagents"):
                    continue
                for attr, member in vars(klass).items():
                    target = getattr(member, "fget", member)
                    if not attr.startswith("_") and inspect.isfunction(target):
                        functions.append((f"{name}.{attr}", target))
    missing: dict[str, str] = {}
    for where, fn in functions:
        hints = typing.get_type_hints(fn, localns=namespace)
        found: set[type] = set()
        _classes_in(hints.get("return"), found)
        for cls in found:
            if cls.__module__.startswith("subagents") and id(cls) not in exported:
                missing[f"{cls.__module__}.{cls.__qualname__}"] = where
    assert missing == {}


def test_a_listing_row_says_what_each_field_means() -> None:
    """R-LIST-2, R-LIST-7: the tutorial prints ``row.activity``; the API reference
    says what each field of a listed row holds -- ``activity``'s ``"running"`` is
    a session live here, not a turn running now -- where it gave only the names."""
    import dataclasses

    from subagents.actors import ChildRow, DescendantRow

    api = (DOCS / "api.md").read_text()
    for cls, fields in (
        (ChildRow, [f.name for f in dataclasses.fields(ChildRow)]),
        (DescendantRow, ["parent_id", "depth"]),
    ):
        section = api.split(f"### `{cls.__name__}(", 1)[1].split("\n### ", 1)[0]
        assert [f for f in fields if f"- `{f}` (attribute): " not in section] == [], cls
    child = api.split("### `ChildRow(", 1)[1].split("\n### ", 1)[0]
    assert '"running"' in child and '"inactive"' in child


def test_the_error_table_names_the_calls_a_closed_runtime_refuses(tmp_path: Path) -> None:
    """R-ERR-1: docs/errors.md's ``RUNTIME_CLOSED`` row names every public call that
    answers it on a closed runtime (it named ``Runtime.spawn`` alone; ``resume``
    and ``interrupt`` say it too, and a drain, which said ``UNAUTHORIZED``)."""
    from subagents.actors import Runtime, UserAuthority
    from subagents.protocol import SubagentError

    rt = Runtime(str(tmp_path / "s.db"))
    agent = rt.spawn("echo")
    sid = agent.session_id
    rt.close()
    calls = {
        "`Runtime.spawn`": lambda: rt.spawn("echo"),
        "`agents.resume`": lambda: rt.agents.resume(sid),
        "`interrupt`": lambda: rt.subagents.interrupt("0" * 31 + "1", UserAuthority(sid)),
        "`drain_continuable_descendants`": lambda: rt.subagents.drain_continuable_descendants(
            [agent]
        ),
    }
    row = next(
        line for line in (DOCS / "errors.md").read_text().splitlines()
        if line.startswith("| `RUNTIME_CLOSED` |")
    )  # fmt: skip
    raised_by = row.split("|")[2]
    for name, call in calls.items():
        with pytest.raises(SubagentError) as info:
            call()
        assert info.value.code == ErrorCode.RUNTIME_CLOSED, name
        assert name in raised_by, name
