"""Structured output: JSON Schemas for a run's final result (``output_schema``).

Nothing is fetched at run time: a ``$ref`` resolves within the schema (by pointer,
by its ``$id``, to an embedded resource's ``$id``) or to a bundled meta-schema, or
not at all -- jsonschema would otherwise fetch a remote one over HTTP at every
turn's end, with no timeout (a server that never answered hung the turn, and on
gevent the hub). An absolute ``$ref`` that resolves to nothing here is refused up
front; a relative one that does not resolve fails the turn's validation.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema_specifications import REGISTRY as _SPECIFICATIONS  # type: ignore[import-untyped]
from subagents.protocol import ErrorCode, SubagentError, error_text

from ._options import AgentOptions

__all__ = ["check_agent_arguments", "check_output_schema", "validate_output"]

#: What a schema's ``$ref`` can reach besides the schema: the bundled meta-schemas
#: (a registry that retrieves nothing).
_NOTHING_ELSE: referencing.Registry[Any] = _SPECIFICATIONS
#: Keywords whose values are data, not schemas: a ``"$ref"`` key there is no reference.
_DATA = frozenset({"const", "default", "enum", "examples"})


def _invalid(why: str) -> SubagentError:
    return SubagentError(
        f"output_schema is not a valid JSON Schema: {why}"[:500], code=ErrorCode.INVALID_ARGUMENT
    )


def _refs(schema: Any) -> Iterator[str]:
    """Every ``$ref`` string in ``schema`` (iteratively: a schema may nest deep; once
    per node: it may hold itself under a keyword the meta-schema does not walk)."""
    stack, seen = [schema], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, Mapping):
            ref = node.get("$ref")
            if isinstance(ref, str):
                yield ref
            stack.extend(v for k, v in node.items() if k not in _DATA)
        elif isinstance(node, list):
            stack.extend(node)


def check_output_schema(schema: Any) -> None:
    """Refuse anything but a valid JSON Schema mapping whose references stay within
    it (``INVALID_ARGUMENT``)."""
    if not isinstance(schema, Mapping):
        raise SubagentError(
            "output_schema must be a JSON Schema mapping", code=ErrorCode.INVALID_ARGUMENT
        )
    try:
        # JSON, whole: a model API is sent it (NaN, say, fails every request).
        json.dumps(schema, allow_nan=False)
    except Exception as exc:  # NaN, a cycle, bytes, a mapping that raises ...
        raise _invalid(f"it is not JSON: {error_text(exc)}") from None
    try:
        dialect = schema.get("$schema")
        if dialect is not None and not isinstance(dialect, str):
            raise _invalid(f"$schema must be a URI string, got {type(dialect).__name__}")
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        specification = referencing.jsonschema.specification_with(
            cls.META_SCHEMA.get("$schema", ""), default=referencing.jsonschema.DRAFT202012
        )
        resolver = _NOTHING_ELSE.resolver_with_root(specification.create_resource(schema))
        for ref in _refs(schema):
            if not urllib.parse.urlsplit(ref).scheme:
                continue  # relative: resolved against its own base as the turn validates
            try:
                resolver.lookup(ref)
            except referencing.exceptions.Unresolvable:
                raise _invalid(
                    f"$ref {ref!r} names a document outside the schema (nothing is fetched)"
                ) from None
    except SubagentError:
        raise
    except jsonschema.SchemaError as exc:
        raise _invalid(exc.message) from exc
    except Exception as exc:  # a cycle (RecursionError), a mapping that raises ...
        raise _invalid(error_text(exc)) from exc


def check_agent_arguments(options: Any, output_schema: Any) -> None:
    """A top-level agent's ``options`` (``AgentOptions`` or None) and ``output_schema``
    (see :func:`check_output_schema`), as ``spawn`` and ``agents.resume`` take them."""
    if options is not None and not isinstance(options, AgentOptions):
        raise SubagentError("options must be AgentOptions", code=ErrorCode.INVALID_ARGUMENT)
    if output_schema is not None:
        check_output_schema(output_schema)


def validate_output(schema: Mapping[str, Any], output: Any) -> tuple[Any, str | None]:
    """``(structured, None)`` when ``output`` satisfies ``schema``, else ``(None, error)``."""
    try:
        validator = jsonschema.validators.validator_for(schema)(schema, registry=_NOTHING_ELSE)
        error = jsonschema.exceptions.best_match(validator.iter_errors(output))
    except Exception as exc:  # an output it cannot walk, a $ref it cannot resolve ...
        return None, error_text(exc, "output cannot be validated: ")
    if error is None:
        return output, None
    return None, f"output does not match the output schema: {error.message}"[:500]
