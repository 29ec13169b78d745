"""Structured output: JSON Schemas for a run's final result (``output_schema``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema
from subagents.protocol import ErrorCode, SubagentError, error_text

__all__ = ["check_output_schema", "validate_output"]


def check_output_schema(schema: Any) -> None:
    """Refuse anything but a valid JSON Schema mapping (``INVALID_ARGUMENT``)."""
    if not isinstance(schema, Mapping):
        raise SubagentError(
            "output_schema must be a JSON Schema mapping", code=ErrorCode.INVALID_ARGUMENT
        )
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise SubagentError(
            f"output_schema is not a valid JSON Schema: {exc.message}",
            code=ErrorCode.INVALID_ARGUMENT,
        ) from exc


def validate_output(schema: Mapping[str, Any], output: Any) -> tuple[Any, str | None]:
    """``(structured, None)`` when ``output`` satisfies ``schema``, else ``(None, error)``."""
    validator = jsonschema.validators.validator_for(schema)(schema)
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(output))
    except Exception as exc:  # an output it cannot walk: a cycle, a raising __eq__ ...
        return None, error_text(exc, "output cannot be validated: ")
    if error is None:
        return output, None
    return None, f"output does not match the output schema: {error.message}"[:500]
