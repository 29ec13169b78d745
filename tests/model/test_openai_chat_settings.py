"""``openai_chat`` settings of the wrong type -- a URL, key, account id or header
that is not a str -- are refused when the model is registered with a typed
``INVALID_ARGUMENT`` naming the setting (they raised a raw ``TypeError`` or
``AttributeError``), and a key's value is never shown. R-ERR-1 (typed errors at a
boundary; docs/errors.md: ``INVALID_ARGUMENT`` for every public call given a wrong
type)."""

from __future__ import annotations

from typing import Any

import pytest
from subagents.actors import openai_chat
from subagents.actors._model._http import Endpoint, check_endpoint
from subagents.protocol import ErrorCode, SubagentError

WRONG_TYPES: dict[str, tuple[dict[str, Any], str]] = {
    "organization an int": ({"organization": 123}, "organization"),
    "organization a list, with headers": (
        {"headers": {"X-A": "1"}, "organization": ["org"]},
        "organization",
    ),
    "project bytes": ({"project": b"proj"}, "project"),
    "base_url an int": ({"base_url": 123}, "base_url"),
    "base_url bytes": ({"base_url": b"http://127.0.0.1:9/v1"}, "base_url"),
    "api_key an int": ({"api_key": 5}, "api_key"),
    "api_key bytes": ({"api_key": b"sk-abc"}, "api_key"),
    "a header value an int": ({"headers": {"X": 1}}, "headers"),
    "a header value a list": ({"headers": {"X": ["a"]}}, "headers"),
    "a header name bytes": ({"headers": {b"X": "a"}}, "headers"),
    "headers a str": ({"headers": "x"}, "headers"),
    "headers a list of pairs": ({"headers": [("X", "a")]}, "headers"),
    "system an int": ({"system": 5}, "system"),
}


@pytest.mark.parametrize("case", sorted(WRONG_TYPES))
def test_a_setting_of_the_wrong_type_is_invalid_argument(case: str) -> None:
    kw: dict[str, Any] = {"base_url": "http://127.0.0.1:9/v1", "api_key": "sk-abc"}
    settings, name = WRONG_TYPES[case]
    kw.update(settings)
    with pytest.raises(SubagentError) as err:
        openai_chat("gpt-test", **kw)
    assert err.value.code == ErrorCode.INVALID_ARGUMENT
    assert name in str(err.value)
    assert "abc" not in str(err.value)  # the key is not shown


def test_none_and_str_settings_pass() -> None:
    openai_chat(
        "gpt-test",
        base_url="http://127.0.0.1:9/v1",
        api_key="k",
        organization=None,
        project="proj_1",
        headers={"X-A": "1"},
        system=None,
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"base_url": 123},
        {"organization": 123},
        {"project": ["p"]},
        {"headers": {"X": 1}},
    ],
    ids=["base_url", "organization", "project", "header value"],
)
def test_an_endpoint_of_the_wrong_types_is_refused_by_its_check(fields: dict[str, Any]) -> None:
    """An :class:`Endpoint` built past ``openai_chat``: its check is typed too."""
    endpoint = Endpoint(**{"base_url": "http://127.0.0.1:9/v1", "api_key": "k", **fields})
    with pytest.raises(SubagentError) as err:
        check_endpoint(endpoint)
    assert err.value.code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize("value", [-1, 2.5, "3", True])
def test_a_max_history_that_is_no_count_is_invalid_argument(value: Any) -> None:
    """``max_history`` is an int >= 0 or ``None``."""
    with pytest.raises(SubagentError) as err:
        openai_chat("gpt-test", base_url="http://127.0.0.1:9/v1", api_key="k", max_history=value)
    assert err.value.code == ErrorCode.INVALID_ARGUMENT
    assert "max_history" in str(err.value)
