"""What the CLI prints with ``--json``: strict JSON, whatever a log holds.

Event content is free-form, so a log may hold values JSON has no literal for.
They are rendered, never dropped: bytes as hex, datetimes in ISO 8601, a float
that is not finite as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``,
anything else as its ``repr``. A map key that is no string is rendered so too,
then as its JSON text (``None`` as ``"null"``, ``1`` as ``"1"``, bytes as hex).
A map two of whose keys render alike (``1`` and ``"1"``, ``None`` and
``"null"``, ``b"\\x01"`` and ``"01"``) is a list of ``[key, value]`` pairs
instead, in its order, each key rendered as a value is: no entry is lost. A map
of string keys, or of keys that stay distinct, is an object.
:func:`dumps` refuses a non-finite float outright (``allow_nan=False``), so the
output always parses with a strict JSON reader.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["dumps", "jsonable"]


def _float(value: float) -> float | str:
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (see the module docstring)."""
    if isinstance(value, dict):
        out = {_key(k): jsonable(v) for k, v in value.items()}
        if len(out) < len(value):  # keys collided: pairs, lest entries be lost
            return [[jsonable(k), jsonable(v)] for k, v in value.items()]
        return out
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return repr(value)


def _key(key: Any) -> str:
    """A map key as a JSON object key: a string as it is, else rendered as a value
    is, as JSON text unless that is a string (``str(key)`` gave ``"b'\\x01'"``)."""
    if isinstance(key, str):
        return key
    rendered = jsonable(key)
    return rendered if isinstance(rendered, str) else json.dumps(rendered, allow_nan=False)


def dumps(value: Any) -> str:
    """Strict, indented JSON text of ``value``."""
    return json.dumps(jsonable(value), indent=2, allow_nan=False)
