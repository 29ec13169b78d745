"""The docs stay true: the tutorial runs, every public name and error code is documented."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

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
