"""``openai_chat`` settings HTTP cannot carry are refused when the model is
registered (``INVALID_ARGUMENT``), not by every turn with an untyped error; and a
request httpx refuses to send is a ``MODEL_ERROR`` at once, not retried as a
connection error. R-ERR-1 (typed errors at a boundary)."""

from __future__ import annotations

from typing import Any

import pytest
from model_kit import run_turn
from subagents.actors import OpenAIChat, Runtime, openai_chat
from subagents.actors._model import _http
from subagents.actors._model._http import Endpoint
from subagents.actors.testing import FakeOpenAI
from subagents.protocol import ErrorCode, SubagentError

UNSENDABLE = {
    "non-ASCII api_key": {"api_key": "sk-abc\u2019"},
    "non-ASCII header value": {"headers": {"X-User": "J\u00f6rg"}},
    "newline in api_key": {"api_key": "k\nX-Injected: 1"},
    "NUL in a header value": {"headers": {"X-A": "a\x00b"}},
    "empty header name": {"headers": {"": "x"}},
    "header name with a space": {"headers": {"X A": "x"}},
    "header value with a leading space": {"headers": {"X-A": " x"}},
    "non-ASCII organization": {"organization": "org-\u00e9"},
    "unparsable base_url": {"base_url": "http://[::1/v1"},
    "control character in base_url": {"base_url": "http://127.0.0.1:9/v1\x00"},
    "base_url without a host": {"base_url": "http:///v1"},
}


@pytest.mark.parametrize("case", sorted(UNSENDABLE))
def test_settings_http_cannot_carry_are_refused_at_once(case: str) -> None:
    kw: dict[str, Any] = {"base_url": "http://127.0.0.1:9/v1", "api_key": "k"}
    kw.update(UNSENDABLE[case])
    with pytest.raises(SubagentError) as err:
        openai_chat("gpt-test", **kw)
    assert err.value.code == ErrorCode.INVALID_ARGUMENT
    assert "abc" not in str(err.value)  # the key is not shown


def test_sendable_settings_pass() -> None:
    openai_chat(
        "gpt-test",
        base_url="http://[::1]:9/v1",
        api_key="sk-proj-abc_DEF-123",
        headers={"X-Trace": "a b\tc", "X-Empty": ""},
    )


@pytest.mark.parametrize(
    "endpoint",
    [
        {"api_key": "test-key", "headers": {"X-A": "a\r\nb"}},
        {"api_key": "test-key", "base_url": "http://[::1/v1"},
    ],
    ids=["newline in a header", "unparsable URL"],
)
def test_a_request_httpx_refuses_is_a_model_error_not_retried(
    rt: Runtime, fake: FakeOpenAI, endpoint: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An endpoint built past ``openai_chat``'s checks: the turn fails with
    ``MODEL_ERROR`` (``LocalProtocolError`` was retried as "cannot reach", with
    back-off; ``InvalidURL`` escaped untyped), and the agent goes on."""
    settings = {"base_url": fake.base_url, "max_retries": 5, **endpoint}
    retries: list[int] = []

    def no_wait(_headers: Any, done: int, _most: int) -> float:
        retries.append(done)
        return 0.0

    monkeypatch.setattr(_http, "retry_delay", no_wait)

    def factory(_options: Any) -> OpenAIChat:
        return OpenAIChat(
            Endpoint(**settings),
            "gpt-test",
            dispatcher=None,
            system=None,
            stream=False,
            max_tool_rounds=1,
            parameters={},
        )

    rt.models.register("planner", factory)
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "go")
    assert end.stop_reason == "failed"
    assert end.error.startswith("ModelError: [MODEL_ERROR]"), end.error
    assert "cannot reach" not in end.error
    assert fake.requests == [] and retries == []
    assert run_turn(rt, agent, "again").stop_reason == "failed"  # no leftover state
