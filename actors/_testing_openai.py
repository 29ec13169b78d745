"""A loopback fake of an OpenAI-compatible ``POST /v1/chat/completions``.

:class:`FakeOpenAI` is a real HTTP/1.1 server on ``127.0.0.1`` (a free port), in
OS threads of its own, so it serves tests on either backend. Each request takes
the next scripted :class:`Answer` (else asks ``responder``); the same answer is
served as one ``chat.completion`` or, when the request says ``"stream": true``,
as server-sent ``chat.completion.chunk`` events ending with ``data: [DONE]`` --
the wire format of the real API:

* text deltas; tool-call deltas keyed by ``index``, ``id`` and ``name`` only in
  a call's first fragment, ``arguments`` split over several chunks;
  ``finish_reason: "tool_calls"``; a ``usage`` chunk when the request asks for it;
* ``split_utf8``: every event's bytes are written in two pieces cut inside a
  UTF-8 character, and arguments are cut between the two halves of a surrogate
  pair;
* errors: an HTTP status with an ``{"error": {...}}`` body (and headers such as
  ``retry-after-ms``), or an error event mid-stream (``stream_error_after``);
* ``omit_ids``: responses without ``id``, ``created`` and ``model``;
* ``raw``: these bytes as the body instead (status 200 and ``headers``), streamed
  or not -- an answer that cannot be read; ``cut_stream``: a stream that ends after
  the answer's deltas, with no finish reason and no ``[DONE]`` (a broken-off
  connection); :meth:`FakeOpenAI.cut_after_done`: the next streamed answers
  hang up right after ``data: [DONE]``, before the body's last chunk (a
  connection cut as the answer completed); :meth:`FakeOpenAI.hold_after_done`:
  they wait there instead (a body kept open after its answer);
* ``stall``: the answer waits until :meth:`FakeOpenAI.release` or the client
  hangs up (counted in ``disconnects``: how a test sees a request aborted);
  ``trickle``: a stream that sends keep-alive comments (``: ping``) every 20 ms
  until then, and the answer after a release (an error ``status``: blanks, then
  its ``{"error": ...}``).

Every request is checked as the real API checks it: a JSON body with ``model``
and ``messages``, a bearer key when one is set, and each ``tool`` message
answering a ``tool_call_id`` of the assistant message before it (every call
answered) -- else a 400 ``invalid_request_error``.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ._kernel import AbortController
from ._testing_answers import (
    USAGE,
    Answer,
    FakeCall,
    FakeRequest,
    event_bytes,
    split_pair,
    tool_ids_error,
    utf8_cut,
)

__all__ = ["Answer", "FakeCall", "FakeOpenAI", "FakeRequest"]


class FakeOpenAI:
    """The server (see the module docstring). A context manager; :meth:`close` stops it.

    Args:
        api_key: when set, requests must carry ``Authorization: Bearer <api_key>``.
        responder: answers requests the script has no answer left for (default:
            echo the last message's text).
    """

    def __init__(
        self,
        *,
        api_key: str | None = "test-key",
        responder: Callable[[FakeRequest], Answer] | None = None,
    ) -> None:
        self.api_key = api_key
        self.responder = responder or _echo
        self.requests: list[FakeRequest] = []
        self.disconnects = 0
        self._script: list[Answer] = []
        self._after_done = {"cut": 0, "hold": 0}  # streamed answers to cut/hold at [DONE]
        self._cond = threading.Lock()  # guards requests, disconnects, script, conns
        self._changed = AbortController()
        self._released = threading.Event()
        self._closing = threading.Event()
        self._conns: set[socket.socket] = set()
        fake = self

        class Handler(_Handler):
            owner = fake

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-openai",
            daemon=True,
        )
        self._thread.start()

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``: what ``OPENAI_BASE_URL`` should say."""
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *answers: Answer) -> None:
        """Queue answers for the next requests, in order."""
        with self._cond:
            self._script.extend(answers)

    def cut_after_done(self, count: int = 1) -> None:
        """End the next ``count`` streamed answers right after ``data: [DONE]``: the
        server hangs up without the chunked body's last chunk."""
        with self._cond:
            self._after_done["cut"] += count

    def hold_after_done(self, count: int = 1) -> None:
        """Hold the next ``count`` streamed answers open right after ``data: [DONE]``,
        until :meth:`release` or the client hangs up (counted in ``disconnects``)."""
        with self._cond:
            self._after_done["hold"] += count

    def _take(self, what: str) -> bool:
        """Whether this answer is one to ``cut``/``hold`` after [DONE] (counted down)."""
        with self._cond:
            if self._after_done[what] == 0:
                return False
            self._after_done[what] -= 1
            return True

    def release(self) -> None:
        """Let every stalled answer (now and later) go out."""
        self._released.set()

    def _wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        # An AbortSignal's wait is cooperative on gevent (the server's threads wake
        # the hub thread-safely), so a test's main greenlet may wait here.
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                if predicate():
                    return True
                changed = self._changed
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not changed.signal.wait(remaining):
                with self._cond:
                    return predicate()

    def _notify_locked(self) -> None:
        changed, self._changed = self._changed, AbortController()
        changed.abort("changed")

    def wait_requests(self, n: int, timeout: float = 10.0) -> bool:
        """Block (cooperatively on gevent) until ``n`` requests arrived; False on timeout."""
        return self._wait_for(lambda: len(self.requests) >= n, timeout)

    def wait_disconnects(self, n: int, timeout: float = 10.0) -> bool:
        """Block until ``n`` stalled requests were hung up on by the client."""
        return self._wait_for(lambda: self.disconnects >= n, timeout)

    def _next(self, request: FakeRequest) -> Answer:
        with self._cond:
            self.requests.append(request)
            self._notify_locked()
            if self._script:
                return self._script.pop(0)
        return self.responder(request)

    def _stall(self, sock: socket.socket) -> bool:
        """Wait for :meth:`release` (True) or the client hanging up (False)."""
        while not (self._released.is_set() or self._closing.is_set()):
            readable, _, _ = select.select([sock], [], [], 0.02)
            if readable and not sock.recv(1, socket.MSG_PEEK):
                self._hung_up()
                return False
        return not self._closing.is_set()

    def _trickle(self, send: Callable[[bytes], None]) -> bool:
        """Send keep-alive comments until :meth:`release` (True) or the client
        hangs up (False)."""
        while not (self._released.is_set() or self._closing.is_set()):
            try:
                send(b": ping\n\n")
            except OSError:
                self._hung_up()
                return False
            time.sleep(0.02)
        return not self._closing.is_set()

    def _hung_up(self) -> None:
        with self._cond:
            self.disconnects += 1
            self._notify_locked()

    def close(self) -> None:
        """Stop serving, hang up every connection, and join the server's threads."""
        self._closing.set()
        self._server.shutdown()
        with self._cond:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._server.server_close()  # joins the handler threads
        self._thread.join(10)

    def __enter__(self) -> FakeOpenAI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _echo(request: FakeRequest) -> Answer:
    messages = request.messages
    last = messages[-1].get("content") if messages else None
    return Answer(content=f"echo: {last}")


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up (an aborted request) is part of the script


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out at once, as a real server's
    owner: FakeOpenAI

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet

    def setup(self) -> None:
        super().setup()
        with self.owner._cond:
            self.owner._conns.add(self.connection)

    def finish(self) -> None:
        with self.owner._cond:
            self.owner._conns.discard(self.connection)
        super().finish()

    # -- responses ------------------------------------------------------------------

    def _send_json(self, status: int, payload: Any, headers: Mapping[str, str] | None) -> None:
        self._send_body(status, json.dumps(payload).encode(), headers)

    def _send_body(self, status: int, data: bytes, headers: Mapping[str, str] | None) -> None:
        """``data`` as the body; a ``Content-Type`` in ``headers`` replaces JSON's."""
        extra = dict(headers or {})
        self.send_response(status)
        self.send_header("Content-Type", extra.pop("Content-Type", "application/json"))
        self.send_header("Content-Length", str(len(data)))
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _refuse(self, status: int, message: str, kind: str, headers: Any = None) -> None:
        error = {"message": message, "type": kind, "param": None, "code": None}
        self._send_json(status, {"error": error}, headers)

    def _chunked_head(self, status: int, headers: Mapping[str, str]) -> None:
        """A chunked body's head: JSON unless ``headers`` say otherwise."""
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", **headers}.items():
            self.send_header(k, v)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _trickle_refusal(self, answer: Answer, kind: str) -> None:
        """An error answer whose chunked body trickles blanks until a release."""
        self._chunked_head(answer.status, answer.headers or {})
        if not self.owner._trickle(lambda _ping: self._chunk(b" ")):
            self.close_connection = True
            return
        error = {"message": answer.error or "scripted error", "type": kind}
        self._chunk(json.dumps({"error": error}).encode())
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_POST(self) -> None:
        owner = self.owner
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._refuse(404, f"no route {self.path}", "invalid_request_error")
            return
        if owner.api_key is not None and self.headers.get("Authorization") != (
            f"Bearer {owner.api_key}"
        ):
            self._refuse(401, "Incorrect API key provided", "invalid_request_error")
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._refuse(400, "the body is not valid JSON", "invalid_request_error")
            return
        request = FakeRequest(self.path, dict(self.headers.items()), body)
        problem = None
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            problem = "you must provide a model parameter"
        else:
            problem = tool_ids_error(body.get("messages"))
        answer = owner._next(request)
        if problem is not None:
            self._refuse(400, problem, "invalid_request_error")
            return
        if answer.stall and not owner._stall(self.connection):
            self.close_connection = True
            return
        if answer.status >= 400:
            kind = "rate_limit_exceeded" if answer.status == 429 else "server_error"
            if answer.trickle:
                self._trickle_refusal(answer, kind)
            else:
                self._refuse(answer.status, answer.error or "scripted error", kind, answer.headers)
            return
        if answer.raw is not None:
            self._send_body(200, answer.raw, answer.headers)
        elif body.get("stream"):
            self._stream(body, answer)
        else:
            self._send_json(200, self._completion(body, answer), answer.headers)

    def _head(self, body: Any, answer: Answer, kind: str) -> dict[str, Any]:
        if answer.omit_ids:
            return {"object": kind}
        return {
            "id": "chatcmpl-fake",
            "object": kind,
            "created": int(time.time()),
            "model": body.get("model"),
        }

    def _completion(self, body: Any, answer: Answer) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": answer.content}
        if answer.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id or f"call_{i}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.text()},
                }
                for i, c in enumerate(answer.tool_calls)
            ]
        usage = answer.usage or USAGE
        return {
            **self._head(body, answer, "chat.completion"),
            "choices": [{"index": 0, "message": message, "finish_reason": answer.finish_reason}],
            "usage": dict(usage),
        }

    def _deltas(self, answer: Answer) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        if answer.content:
            text = answer.content
            half = len(text) // 2
            deltas += [{"content": part} for part in (text[:half], text[half:]) if part]
        for i, call in enumerate(answer.tool_calls):
            first = {
                "index": i,
                "id": call.id or f"call_{i}",
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            deltas.append({"tool_calls": [first]})
            for piece in split_pair(call.text()):
                deltas.append({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
        return deltas

    def _stream(self, body: Any, answer: Answer) -> None:
        self._chunked_head(
            200, {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
        )
        if answer.trickle and not self.owner._trickle(self._chunk):
            self.close_connection = True
            return
        head = self._head(body, answer, "chat.completion.chunk")
        events: list[Any] = []
        for delta in self._deltas(answer):
            events.append(
                {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            )
        finish = {"index": 0, "delta": {}, "finish_reason": answer.finish_reason}
        if not answer.cut_stream:
            events.append({**head, "choices": [finish]})
        options = body.get("stream_options") or {}
        if options.get("include_usage") and not answer.cut_stream:
            usage = answer.usage or {
                "prompt_tokens": 10,
                "completion_tokens": 5,
                "total_tokens": 15,
            }
            events.append({**head, "choices": [], "usage": dict(usage)})
        for n, event in enumerate(events):
            if answer.stream_error_after is not None and n == answer.stream_error_after:
                error = {"message": answer.error or "stream broke", "type": "server_error"}
                self._chunk(f"event: error\ndata: {json.dumps({'error': error})}\n\n".encode())
                break
            data = event_bytes(event)
            cut = utf8_cut(data) if answer.split_utf8 else None
            if cut is not None:
                self._chunk(data[:cut])
                self._chunk(data[cut:])
            else:
                self._chunk(data)
        else:
            if not answer.cut_stream:
                self._chunk(b"data: [DONE]\n\n")
                if self.owner._take("cut"):
                    self.close_connection = True  # no last chunk: the body is cut
                    return
                if self.owner._take("hold") and not self.owner._stall(self.connection):
                    self.close_connection = True  # the client hung up on the open body
                    return
        self._chunk(b"")
