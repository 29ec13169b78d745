"""The public surface of ``subagents.protocol`` (trio's habit).

Every exported name exists, is defined in exactly one private module (and listed
in that module's ``__all__``), and ``__all__`` has no duplicates. Nothing private
leaks into ``__all__``.
"""

from __future__ import annotations

import importlib
import pkgutil
import types
from collections import Counter

import subagents.protocol as protocol


def _private_modules() -> dict[str, types.ModuleType]:
    found = {
        info.name: importlib.import_module(f"{protocol.__name__}.{info.name}")
        for info in pkgutil.iter_modules(protocol.__path__)
    }
    assert found, "no submodules found"
    assert all(name.startswith("_") for name in found), f"public submodule in {sorted(found)}"
    return found


def test_all_has_no_duplicates() -> None:
    duplicates = [name for name, n in Counter(protocol.__all__).items() if n > 1]
    assert duplicates == []


def test_every_exported_name_exists() -> None:
    missing = [name for name in protocol.__all__ if not hasattr(protocol, name)]
    assert missing == []


def test_every_exported_name_is_defined_in_exactly_one_private_module() -> None:
    modules = _private_modules()
    for name in protocol.__all__:
        homes = [
            mod_name for mod_name, mod in modules.items() if name in getattr(mod, "__all__", ())
        ]
        assert len(homes) == 1, f"{name} is listed in {homes}"
        home = modules[homes[0]]
        assert getattr(home, name) is getattr(protocol, name), f"{name} is re-bound"
        obj = getattr(protocol, name)
        defined_in = getattr(obj, "__module__", None)
        if isinstance(obj, (type, types.FunctionType)):
            assert defined_in == home.__name__, f"{name} defined in {defined_in}"


def test_no_private_names_are_exported() -> None:
    assert [name for name in protocol.__all__ if name.startswith("_")] == []


def test_public_names_of_the_package_are_all_exported() -> None:
    """A name imported into ``__init__`` without being exported is a mistake."""
    public = {
        name
        for name, value in vars(protocol).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public <= set(protocol.__all__), sorted(public - set(protocol.__all__))
