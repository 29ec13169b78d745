"""The gevent server example in a monkey-patched process (``patched_server.py``:
``gevent.monkey.patch_all()`` first, as gunicorn's ``-k gevent`` worker does).

A patched interpreter cannot be pytest's own, so the server is a subprocess
(``server_kit``) spoken to over real sockets from threads of this process.
"""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path
from typing import Any

from server_kit import TOKEN, Server, eventually, start_server, stop_server, strict_json

PATCHED = Path(__file__).with_name("patched_server.py")


def _call(srv: Server, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One request on a new connection, given 20 s (a hung one is an error, not a wait)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=20)
    try:
        headers = {"Authorization": f"Bearer {TOKEN}", "X-Client-Id": "c"}
        conn.request(method, path, None if body is None else json.dumps(body), headers)
        response = conn.getresponse()
        return response.status, strict_json(response.read())
    finally:
        conn.close()


def _at_once(srv: Server, requests: list[tuple[str, str, Any]]) -> list[Any]:
    """``requests`` sent together, one thread each: each one's ``(status, body)``, or
    the exception it raised (a time-out: the server did not answer)."""
    answers: list[Any] = [None] * len(requests)
    start = threading.Barrier(len(requests))

    def send(i: int) -> None:
        start.wait()
        try:
            answers[i] = _call(srv, *requests[i])
        except Exception as exc:  # reported by the assertion
            answers[i] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def test_a_patched_server_serves_concurrent_writes(tmp_path: Path) -> None:
    """Sixteen clients create agents at once, three times, then start children and
    follow them up at once. Each request records its owner in gevent's thread pool;
    the lock its workers share was ``threading.Lock()`` -- gevent's, once patched,
    which pool threads cannot share: one writer finished, the others hung (no
    answer in 20 s). Every request is answered 200, and the server stops cleanly."""
    srv = start_server(tmp_path / "p.db", script=PATCHED)
    try:
        agents: list[str] = []
        for _ in range(3):
            answers = _at_once(srv, [("POST", "/agents", {"label": "boss"})] * 16)
            assert all(isinstance(a, tuple) and a[0] == 200 for a in answers), answers
            agents += [a[1]["session_id"] for a in answers]
        assert len(set(agents)) == 48
        kids = [("POST", f"/agents/{a}/children", {"prompt": "go", "label": "k"}) for a in agents]
        answers = _at_once(srv, kids[:16])
        assert all(isinstance(a, tuple) and a[0] == 200 for a in answers), answers
        children = [(agents[i], a[1]["child_id"]) for i, a in enumerate(answers)]
        followups = [
            ("POST", f"/agents/{a}/children/{c}/followup", {"content": "more"}) for a, c in children
        ]
        answers = _at_once(srv, followups)
        assert all(isinstance(a, tuple) and a[0] == 200 for a in answers), answers
        status, listed = _call(srv, "GET", "/agents")
        assert status == 200 and len(listed["agents"]) == 48, listed

        def ran(agent: str, child: str) -> bool:
            status, data = _call(srv, "GET", f"/sessions/{child}")
            assert status == 200, data
            ends = [e for e in data["events"] if e["type"] == "turn/end"]
            return len(ends) == 2

        for agent, child in children:
            eventually(lambda a=agent, c=child: ran(a, c), "the child ran both messages")
    finally:
        stop_server(srv)
