"""``POST /chat/completions`` over httpx: retries, timeouts, and aborting a request.

Theory of operation
-------------------
A :class:`ChatSession` serves one turn: it owns an ``httpx.Client`` (its
connections are reused by the turn's model calls and closed with the turn) and
listens to the turn's signal. Each request runs through the backend's
``run_waiting``: on threads it blocks the turn's own thread; on gevent it runs
in a pool of the hub's kept for waiting calls, so neither the hub nor the short
I/O calls of the store (which use the hub's own threadpool) stall on the socket.
A request waiting there for a free worker ends at once when the turn is
cancelled, and at its ``timeout``, which counts from when it was queued.

The body is encoded here, not by httpx: a lone surrogate in a text (a tool's
result can carry one) becomes U+FFFD instead of failing the request.

``timeout`` bounds each read and the whole answer: a stream still coming past it
(a server trickling keep-alive comments) is cut at its next chunk, ``TIMEOUT``. A
refusal's body is read until the same deadline, and only its first 64 KiB: one
still coming then is the refusal (its status) with the part that came.
Once a stream's ``data: [DONE]`` came, its answer is whole: a connection cut or
timed out after it (before the body's end) is no error, and nothing is asked again;
the rest of the body is waited for :data:`~._grace.DONE_GRACE` seconds at most.

Cancelling the turn aborts the request at once, whatever it is doing, except
while it connects: httpx's ``trace`` extension hands the session every socket
its client connects, and the signal's listener shuts them down, which wakes a
thread blocked in ``recv`` (a close would not); a connection still being made
ends within the connect timeout (5 s at most). A retry's wait is the signal's
own wait, so it ends early too.

Refused requests are retried as the ``openai`` package does: connection errors,
timeouts, 408, 409, 429 and 5xx (``x-should-retry`` overrides), up to
``max_retries`` times, after :func:`~._retry.retry_delay`.
"""

from __future__ import annotations

import json
import re
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx
from subagents.actors._kernel import GEVENT, AbortSignal, Backend, threading_is_patched
from subagents.actors._kernel._waiting import NoWorkerInTime, run_waiting
from subagents.protocol import ErrorCode, SubagentError

from ._grace import DoneGrace, after_done, shutdown
from ._retry import retry_delay, should_retry
from ._wire import (
    ChunkAccumulator,
    Completion,
    ModelError,
    SSEDecoder,
    bad_request,
    completion_from_response,
    decode_json,
    encode_body,
    error_from_body,
)

__all__ = ["ChatSession", "Endpoint", "check_endpoint"]

#: The most of a refusal's body read (its ``error`` object is a few hundred bytes).
MAX_ERROR_BODY: Final = 64 * 1024

_SSL: list[ssl.SSLContext] = []
_SSL_LOCK = threading.Lock()


def _ssl_context() -> ssl.SSLContext:
    """One verifying context for every client (building one reads the CA bundle)."""
    with _SSL_LOCK:
        if not _SSL:
            import certifi

            _SSL.append(ssl.create_default_context(cafile=certifi.where()))
        return _SSL[0]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where and how to reach an OpenAI-compatible API."""

    base_url: str
    api_key: str | None
    organization: str | None = None
    project: str | None = None
    timeout: float = 600.0
    connect_timeout: float = 5.0
    max_retries: int = 2
    headers: Mapping[str, str] | None = None

    @property
    def url(self) -> str:
        """The chat-completions URL."""
        return self.base_url.rstrip("/") + "/chat/completions"

    def request_headers(self) -> dict[str, str]:
        """Authorization and the openai package's account headers."""
        headers = {"Accept": "application/json", "User-Agent": "subagents-openai-chat"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        if self.organization:
            headers["OpenAI-Organization"] = self.organization
        if self.project:
            headers["OpenAI-Project"] = self.project
        headers.update(self.headers or {})
        return headers


_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_VALUE: Final = re.compile(r"(?:[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?)?\Z")


def check_endpoint(endpoint: Endpoint) -> None:
    """Refuse what no request to ``endpoint`` could carry: a URL httpx cannot parse
    or without a host, a header name that is not an HTTP token, a value that is
    not printable ASCII (a CR, LF or NUL in it, or blanks around it) -- the API key
    and account ids included. The message never shows a header's value.

    Raises:
        SubagentError: ``INVALID_ARGUMENT``, also for a URL, name or value not a str.
    """
    if not isinstance(endpoint.base_url, str):
        raise bad_request(f"base_url is a str, got {type(endpoint.base_url).__name__}")
    try:
        url = httpx.URL(endpoint.url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise bad_request(f"base_url cannot be parsed: {exc}"[:300]) from None
    if url.scheme not in ("http", "https") or not url.host:
        raise bad_request(
            f"base_url is an http(s) URL with a host, got {endpoint.base_url[:100]!r}"
        )
    headers: Mapping[Any, Any] = endpoint.request_headers()  # built past openai_chat?
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            shown = repr(name)[:100] if isinstance(name, str) else type(name).__name__
            raise bad_request(f"the header {shown} is not a str name with a str value")
        if not _TOKEN.match(name):
            raise bad_request(f"the header name {name[:100]!r} is not an HTTP token")
        if not _VALUE.match(value):
            what = "the API key" if name == "Authorization" else f"the header {name!r}"
            raise bad_request(
                f"{what} is not printable ASCII without blanks around it (HTTP cannot send it)"
            )


class _Retry(Exception):
    """An attempt failed in a way worth trying again."""

    def __init__(self, error: SubagentError, headers: Mapping[str, str] | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.headers = headers


class ChatSession:
    """One turn's HTTP session (see the module docstring). A context manager."""

    def __init__(self, endpoint: Endpoint, signal: AbortSignal, backend: Backend) -> None:
        self._endpoint = endpoint
        self._signal = signal
        self._backend = backend
        self._lock = threading.Lock()
        self._sockets: list[Any] = []
        self._client = httpx.Client(
            timeout=httpx.Timeout(endpoint.timeout, connect=endpoint.connect_timeout),
            verify=_ssl_context(),
            headers=endpoint.request_headers(),
        )
        self._remove = signal.add_listener(self._abort)
        self.requests = 0  # attempts made, retries included

    def __enter__(self) -> ChatSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening to the signal and close the client's connections."""
        self._remove()
        self._client.close()

    def _abort(self, _reason: Any) -> None:
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            shutdown(sock)

    def _trace(self, name: str, info: Mapping[str, Any]) -> None:
        if name.endswith((".connect_tcp.complete", ".start_tls.complete")):
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is None:
                return
            with self._lock:
                self._sockets.append(sock)
            if self._signal.aborted:
                shutdown(sock)

    def _cancelled(self) -> SubagentError:
        return SubagentError(
            f"the model call was cancelled: {self._signal.reason!r}"[:300],
            code=ErrorCode.CANCELLED,
            hint=self._signal.reason,
        )

    def complete(self, body: Mapping[str, Any]) -> Completion:
        """Send one chat-completions request (retrying as the module says); the answer.

        Raises:
            SubagentError: ``CANCELLED`` when the signal aborts, ``TIMEOUT`` when
                the last try timed out, :class:`~._wire.ModelError` when the API
                refused it or broke off.
        """
        retries = 0
        while True:
            if self._signal.aborted:
                raise self._cancelled()
            try:
                return self._send(body)
            except _Retry as retry:
                if self._signal.aborted:
                    raise self._cancelled() from None
                if retries >= self._endpoint.max_retries:
                    raise retry.error from None
                delay = retry_delay(retry.headers, retries, self._endpoint.max_retries)
                retries += 1
                if self._signal.wait(delay):
                    raise self._cancelled() from None

    def _send(self, body: Mapping[str, Any]) -> Completion:
        """One attempt through the backend's ``run_waiting``. On gevent it may wait
        for a worker of the hub's waiting pool: the request's deadline starts now,
        and a cancel or the deadline ends that wait (the attempt then never runs)."""
        deadline = time.monotonic() + self._endpoint.timeout
        backend = self._backend
        if backend is not GEVENT and not threading_is_patched():
            result: Completion = backend.run_waiting(self._attempt, body, deadline)
            return result
        try:
            result = run_waiting(
                self._attempt, (body, deadline), {}, signal=self._signal, deadline=deadline
            )
        except NoWorkerInTime:
            raise _Retry(self._timed_out("no worker was free to send it"), None) from None
        except SubagentError as exc:
            if exc.code == ErrorCode.CANCELLED and self._signal.aborted:
                raise self._cancelled() from None
            raise
        return result

    def _timed_out(self, why: object) -> SubagentError:
        return SubagentError(
            f"the model API did not answer in time: {why}"[:300], code=ErrorCode.TIMEOUT
        )

    def _attempt(self, body: Mapping[str, Any], deadline: float) -> Completion:
        if self._signal.aborted:  # cancelled while it waited for a worker
            raise self._cancelled()
        self.requests += 1
        try:
            with self._client.stream(
                "POST",
                self._endpoint.url,
                content=encode_body(body),
                headers={"Content-Type": "application/json"},
                extensions={"trace": self._trace},
            ) as response:
                if response.status_code >= 400:
                    raw = self._error_body(response, deadline)
                    try:
                        parsed: Any = json.loads(raw)
                    except ValueError:
                        parsed = {"error": raw[:500].decode("utf-8", "replace")}
                    error = error_from_body(response.status_code, parsed)
                    if should_retry(response.status_code, response.headers):
                        raise _Retry(error, response.headers)
                    raise error
                kind = response.headers.get("content-type", "")
                if body.get("stream") and kind.startswith("text/event-stream"):
                    return self._read_stream(response, deadline)
                raw = b"".join(_until(response.iter_bytes(), deadline))
                return completion_from_response(decode_json(raw, "answer"))
        except (httpx.LocalProtocolError, httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            # The request itself cannot be sent: trying again would not help.
            if self._signal.aborted:
                raise self._cancelled() from None
            raise ModelError(f"the request cannot be sent: {exc}"[:300]) from None
        except httpx.TimeoutException as exc:
            if self._signal.aborted:
                raise self._cancelled() from None
            raise _Retry(self._timed_out(exc), None) from None
        except httpx.TransportError as exc:
            if self._signal.aborted:
                raise self._cancelled() from None
            raise _Retry(ModelError(f"cannot reach the model API: {exc}"[:300]), None) from None
        except httpx.HTTPError as exc:  # a body its encoding cannot undo, too many redirects
            if self._signal.aborted:
                raise self._cancelled() from None
            raise ModelError(f"the model API's answer cannot be read: {exc!r}"[:300]) from None

    def _error_body(self, response: httpx.Response, deadline: float) -> bytes:
        """The first :data:`MAX_ERROR_BODY` bytes of a refusal's body, read until its
        end, that size or ``deadline``: the status already says what happened, so a
        body that trickles on (or never ends) is not waited for -- ``response.read()``
        would wait as long as bytes keep coming, past every timeout -- and a cut or
        timed-out one is the refusal with what came of it."""
        parts: list[bytes] = []
        size = 0
        try:
            for part in _until(response.iter_bytes(), deadline):
                parts.append(part)
                size += len(part)
                if size >= MAX_ERROR_BODY:
                    break
        except httpx.TransportError:
            if self._signal.aborted:
                raise
        return b"".join(parts)[:MAX_ERROR_BODY]

    def _read_stream(self, response: httpx.Response, deadline: float) -> Completion:
        decoder = SSEDecoder()
        acc = ChunkAccumulator()
        done = False
        grace: DoneGrace | None = None
        try:
            for data in _until(response.iter_bytes(), deadline):
                for event, text in decoder.feed(data):
                    if done:
                        continue
                    if text == "[DONE]":
                        # Read on to the end of the body: the connection then goes back
                        # to the pool for the turn's next call instead of being reset --
                        # for a short grace only (._grace), the answer is in hand.
                        done = True
                        if grace is None:  # (a second [DONE] arms no second watchdog)
                            grace = after_done(response, deadline)
                        continue
                    chunk = decode_json(text, "stream chunk")
                    if event == "error":
                        raise error_from_body(None, chunk)
                    acc.add(chunk)
        except httpx.TransportError:
            # Cut (or timed out, or its grace over) after [DONE]: the answer is whole,
            # only the rest of the body is lost -- asking again would run the model twice.
            if not done or self._signal.aborted:
                raise
        finally:
            if grace is not None:
                grace.cancel()
        if self._signal.aborted:
            raise self._cancelled()
        if acc.chunks == 0 and not done:
            raise ModelError("the model's stream ended before any chunk")
        answer = acc.completion()
        if not done and answer.finish_reason is None:
            # Neither [DONE] nor a finish reason: the connection broke off mid-answer.
            raise ModelError("the model's stream broke off before its answer ended")
        if acc.choices == 0:
            # Only a usage chunk, or only [DONE]: as non-streamed, no answer at all.
            raise ModelError("the model's answer has no choices[0] (no chunk carried one)")
        return answer


def _until(chunks: Iterator[bytes], deadline: float) -> Iterator[bytes]:
    """``chunks`` until ``deadline`` (``time.monotonic``); past it, ``TIMEOUT``."""
    for chunk in chunks:
        if time.monotonic() > deadline:
            raise httpx.ReadTimeout("the answer took longer than the request's timeout")
        yield chunk
