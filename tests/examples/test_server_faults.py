"""The gevent server example when things go wrong: a SIGTERM with requests in flight,
the database down, a request body cut short, damaged rows, a bug.

Every server is a real subprocess (``server_kit``) spoken to over real sockets;
the tests poll it as a client would and never wait on a timing. The store-related
ones run on SQLite and on PostgreSQL (``db``); the database outage on a private
PostgreSQL cluster (``own_pg_server``), stopped and started again.
"""

from __future__ import annotations

import functools
import http.client
import json
import re
import signal
import socket
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from pgcluster import outside_sql
from server_kit import TOKEN, Server, eventually, start_server, stop_server, strict_json
from subagents.protocol import SessionId

FAULTY = Path(__file__).with_name("faulty_server.py")
SMALL_POOL = Path(__file__).with_name("small_pool_server.py")


def _agent(srv: Server, label: str = "boss") -> str:
    status, made = srv.call("POST", "/agents", {"label": label})
    assert status == 200, made
    return str(made["session_id"])


def _events(srv: Server, session: str) -> list[dict[str, Any]]:
    status, data = srv.call("GET", f"/sessions/{session}")
    assert status == 200, data
    return list(data["events"])


def _ended(srv: Server, session: str) -> bool:
    return any(e["type"] == "turn/end" for e in _events(srv, session))


def _head(method: str, path: str, extra: str = "") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"X-Client-Id: c\r\n{extra}\r\n"
    ).encode()


def _connect(srv: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=30)


def _response(sock: socket.socket) -> tuple[int, dict[str, str], Any]:
    """Read one response from ``sock``: status, headers, its JSON body (strictly)."""
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, dict(response.getheaders()), strict_json(response.read())


def _refused(srv: Server) -> bool:
    try:
        socket.create_connection(("127.0.0.1", srv.port), timeout=30).close()
    except ConnectionRefusedError:
        return True
    return False


def _stopped_listening(srv: Server) -> None:
    """Wait for the line a stopping server prints once its listener is closed, and
    see a new connection refused. (Probing before that line raced the listener's
    closing: a connect whose handshake the kernel had completed, the server not
    yet accepted it, was reset under the client, a ``ConnectionResetError``.)"""
    assert srv.proc.stdout is not None
    line = srv.proc.stdout.readline()
    assert line.startswith("stopped listening on http://"), line
    assert _refused(srv), "new connections refused once stopping"


# -- SIGTERM ---------------------------------------------------------------------------


def test_sigterm_finishes_the_requests_in_flight(db: str) -> None:
    """A SIGTERM stops new connections at once, then waits for the requests in flight:
    one whose body is still coming is answered 200 (``Connection: close``) and its
    message kept; one begun on a kept-alive connection is refused 503 (typed, with
    ``Retry-After`` and ``Connection: close``); an idle kept-alive connection is
    closed; an ``/events`` stream ends cleanly. The runtime closes only then (it was
    closed under them: 400 ``STORE_CLOSED``, or the connections reset)."""
    srv = start_server(db)
    try:
        agent = _agent(srv)
        path = f"/agents/{agent}/messages"
        body = b'{"content": "in flight"}'
        busy = _connect(srv)  # its body still coming when the SIGTERM arrives
        busy.sendall(_head("POST", path, f"Content-Length: {len(body)}\r\n") + body[:5])
        late = _connect(srv)  # its headers still coming
        late.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode())
        stream = srv.connect()
        stream.request("GET", "/events", headers={"Authorization": f"Bearer {TOKEN}"})
        events = stream.getresponse()
        assert strict_json(events.readline())["type"] == "subscribed"
        # Kept alive, then idle. Accepted after the others (a listener's backlog is
        # first in, first out), so they are being served once this is answered.
        idle = srv.connect()
        idle.request("GET", "/stats", headers={"Authorization": f"Bearer {TOKEN}"})
        response = idle.getresponse()
        assert response.status == 200 and strict_json(response.read())["event_streams"] == 1
        assert idle.sock is not None

        srv.proc.send_signal(signal.SIGTERM)
        _stopped_listening(srv)

        busy.sendall(body[5:])
        status, headers, accepted = _response(busy)
        assert status == 200, accepted
        assert headers["Connection"] == "close"
        late.sendall(
            f"Authorization: Bearer {TOKEN}\r\nX-Client-Id: c\r\n"
            f'Content-Length: 16\r\n\r\n{{"content": "x"}}'.encode()
        )
        status, headers, refused = _response(late)
        assert status == 503, refused
        assert refused["error"]["code"] == "SHUTTING_DOWN", refused
        assert headers["Connection"] == "close" and int(headers["Retry-After"]) > 0
        assert events.read() == b"", "the event stream ended (a clean last chunk)"
        assert idle.sock.recv(1) == b"", "the idle kept-alive connection was closed"
        assert srv.proc.wait(30) == 0
        for sock in (busy, late):
            sock.close()
        idle.close()
        stream.close()
    finally:
        stop_server(srv)
    srv = start_server(db)
    try:
        status, sent = srv.call("POST", path, {"content": "after"})  # resumes it here
        assert status == 200, sent

        def ran() -> list[Any]:
            return [e.get("output") for e in _events(srv, agent) if e["type"] == "turn/end"]

        eventually(lambda: "after" in ran(), "the agent ran its messages")
        assert ran() == ["in flight", "after"]
    finally:
        stop_server(srv)


def test_sigterm_answers_the_connections_the_backlog_held(db: str) -> None:
    """Connections the server had not accepted yet when the SIGTERM came (its pool
    full: ``small_pool_server.py`` serves one at a time) were reset as the listener
    closed, a request sent on one left not knowing whether it ran. They are accepted
    before the listener closes: one whose request was sent is answered 503
    ``SHUTTING_DOWN`` (``Retry-After``, ``Connection: close``) and the request is not
    run; one with nothing sent yet is closed cleanly (no reset)."""
    srv = start_server(db, script=SMALL_POOL)
    try:
        agent = _agent(srv)
        path = f"/agents/{agent}/messages"
        held = srv.connect()  # the pool's one slot, kept alive then idle
        held.request("GET", "/stats", headers={"Authorization": f"Bearer {TOKEN}"})
        assert held.getresponse().read()
        assert held.sock is not None
        # The pool is full once ``held`` was answered: these wait in the backlog.
        queued = _connect(srv)
        body = b'{"content": "queued"}'
        queued.sendall(_head("POST", path, f"Content-Length: {len(body)}\r\n") + body)
        silent = _connect(srv)

        srv.proc.send_signal(signal.SIGTERM)
        _stopped_listening(srv)

        status, headers, refused = _response(queued)
        assert status == 503, refused
        assert refused["error"]["code"] == "SHUTTING_DOWN", refused
        assert headers["Connection"] == "close" and int(headers["Retry-After"]) > 0
        assert silent.recv(1) == b"", "closed, not reset"
        assert held.sock.recv(1) == b"", "the idle kept-alive connection was closed"
        assert srv.proc.wait(30) == 0
        for sock in (queued, silent):
            sock.close()
        held.close()
    finally:
        stop_server(srv)
    srv = start_server(db)
    try:
        assert not [e for e in _events(srv, agent) if e["type"] == "message"]
    finally:
        stop_server(srv)


def test_a_request_the_drain_outlasts_is_a_typed_503(tmp_path: Path) -> None:
    """A follow-up still running when the SIGTERM's drain ends (it waits for the
    SQLite write lock another process holds): pywsgi killed its greenlet and
    answered a bare-text 500, though the follow-up may yet be committed (its write
    goes on in the thread pool). It is a 503 ``SHUTTING_DOWN`` (JSON, ``Retry-After``)
    saying the outcome is unknown; sent again with the same ``message_id`` to the
    restarted server, it is accepted, and the child runs it once."""
    db = tmp_path / "d.db"
    srv = start_server(db)
    try:
        agent = _agent(srv)
        status, kid = srv.call("POST", f"/agents/{agent}/children", {"prompt": "p", "label": "k"})
        assert status == 200, kid
        child = kid["child_id"]
        eventually(functools.partial(_ended, srv, child), "the child ran its prompt")
        path = f"/agents/{agent}/children/{child}/followup"
        late = {"content": "late", "message_id": uuid.uuid4().hex}
        body = json.dumps(late).encode()
        holder = sqlite3.connect(db, timeout=30, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # every write of the server's waits now
        try:
            stuck = _connect(srv)
            stuck.sendall(_head("POST", path, f"Content-Length: {len(body)}\r\n") + body)
            # Accepted after the follow-up (a backlog is first in, first out): it is
            # being served once this is answered.
            assert srv.call("GET", "/stats")[0] == 200
            srv.proc.send_signal(signal.SIGTERM)
            status, headers, answer = _response(stuck)  # after the drain's 5 s
            stuck.close()
        finally:
            holder.rollback()
            holder.close()
        assert status == 503, answer
        assert answer["error"]["code"] == "SHUTTING_DOWN", answer
        assert "unknown" in answer["error"]["message"], answer
        assert "message_id" in answer["error"]["message"], answer
        assert headers["Connection"] == "close" and int(headers["Retry-After"]) > 0
        assert srv.proc.wait(30) == 0
    finally:
        stop_server(srv)
    srv = start_server(db)
    try:
        status, sent = srv.call("POST", path, late)
        assert status == 200 and sent["message_id"] == late["message_id"], sent

        def turns() -> list[Any]:
            status, data = srv.call("GET", f"/sessions/{child}")
            assert status == 200, data
            return [e for e in data["events"] if e["type"] == "turn/end"]

        eventually(lambda: len(turns()) == 2, "the child ran the follow-up")
        status, data = srv.call("GET", f"/sessions/{child}")
        runs = [e for e in data["events"] if e["type"] == "turn/start"]
        assert sum(r["message_ids"].count(late["message_id"]) for r in runs) == 1, runs
    finally:
        stop_server(srv)


# -- the database down -------------------------------------------------------------------


def test_a_database_outage_is_a_typed_503_and_passes(own_pg_server: Any) -> None:
    """PostgreSQL stopped: every route that needs it answers 503
    ``PERSISTENCE_UNAVAILABLE`` with ``Retry-After`` (it was a 500 with psycopg's
    traceback where the ownership table was read, a 400 elsewhere), and no
    traceback is printed; once the database is back, the same requests succeed."""
    url = f"{own_pg_server.url}?schema=s_{uuid.uuid4().hex[:12]}"
    srv = start_server(url)
    try:
        agent = _agent(srv)
        status, kid = srv.call("POST", f"/agents/{agent}/children", {"prompt": "p", "label": "k"})
        assert status == 200, kid
        child = kid["child_id"]
        routes: list[tuple[str, str, Any]] = [
            ("GET", "/agents", None),
            ("POST", "/agents", {"label": "x"}),
            ("POST", f"/agents/{agent}/messages", {"content": "down"}),
            ("POST", f"/agents/{agent}/children", {"prompt": "p", "label": "k2"}),
            ("POST", f"/agents/{agent}/children/{child}/followup", {"content": "down"}),
            ("POST", f"/agents/{agent}/children/{child}/interrupt", {}),
            ("GET", f"/agents/{agent}/children", None),
            ("GET", f"/agents/{agent}/descendants", None),
            ("GET", f"/sessions/{agent}", None),
        ]
        own_pg_server.stop("immediate")
        try:
            for method, path, body in routes:
                conn = srv.connect()
                try:
                    headers = {"Authorization": f"Bearer {TOKEN}", "X-Client-Id": "c"}
                    data = None if body is None else json.dumps(body)
                    conn.request(method, path, body=data, headers=headers)
                    response = conn.getresponse()
                    answer = strict_json(response.read())
                finally:
                    conn.close()
                assert response.status == 503, (method, path, response.status, answer)
                assert answer["error"]["code"] == "PERSISTENCE_UNAVAILABLE", (path, answer)
                assert int(response.getheader("Retry-After") or 0) > 0, path
            assert srv.call("GET", "/stats")[0] == 200  # nothing there needs the database
        finally:
            own_pg_server.start()
        status, listed = srv.call("GET", "/agents")
        assert status == 200, listed
        assert [a["session_id"] for a in listed["agents"]] == [agent]
        path = f"/agents/{agent}/children/{child}/followup"
        status, sent = srv.call("POST", path, {"content": "up"})
        assert status == 200, sent
    finally:
        err = stop_server(srv, tracebacks=None)
    # The example logged each failure as one line. (The runtime's own background
    # work may log its failures meanwhile, e.g. "mail pickup failed": not the
    # example's to say.)
    for record in _log_records(err):
        theirs = record.startswith("ERROR subagents:") and "gevent_server" not in record
        assert "Traceback" not in record or theirs, record
    assert err.count("WARNING gevent_server: ") >= len(routes), err


def _log_records(err: str) -> list[str]:
    """``err`` (the server's stderr) as log records, ``"LEVEL logger: message..."``
    with their continuation lines; text printed outside the log is a record too."""
    records: list[str] = []
    for line in err.splitlines():
        stamp = re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ", line)
        if stamp or not records:
            records.append(line[stamp.end() :] if stamp else line)
        else:
            records[-1] += "\n" + line
    return records


# -- a bug ----------------------------------------------------------------------------


def test_an_unexpected_exception_is_a_typed_500_logged_once(tmp_path: Path) -> None:
    """A handler that raises what nobody expected (``faulty_server.py`` breaks
    ``GET /stats``): a 500 whose body is the usual JSON error, code ``INTERNAL``
    (it was pywsgi's bare text), its traceback logged once; the server goes on."""
    srv = start_server(tmp_path / "f.db", script=FAULTY)
    try:
        status, body = srv.call("GET", "/stats")
        assert status == 500, body
        assert body["error"]["code"] == "INTERNAL", body
        assert "a bug put in" not in body["error"]["message"]  # the log has it, not the client
        assert srv.call("GET", "/agents")[0] == 200
    finally:
        err = stop_server(srv, tracebacks=1)
    assert err.count("RuntimeError: a bug put in by faulty_server.py") == 1, err
    assert "GET /stats" in err, err


# -- bodies cut short -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ("Content-Length: 100\r\n", b'{"con'),
        ("Transfer-Encoding: chunked\r\n", b'10\r\n{"content": 1'),
        ("Transfer-Encoding: chunked\r\n", b'8\r\n{"conten\r\n'),
        ("Transfer-Encoding: chunked\r\n", b'zz\r\n{"content": 1}\r\n0\r\n\r\n'),
    ],
    ids=["short-content-length", "cut-chunk", "no-last-chunk", "bad-chunk-size"],
)
def test_a_body_cut_short_is_a_typed_400(tmp_path: Path, headers: str, body: bytes) -> None:
    """A body shorter than its ``Content-Length``, or a chunked one cut off, then the
    client half-closes (it was a 500 and a traceback); a chunk size that is no hex
    number (it was pywsgi's bare 400): 400 ``INVALID_ARGUMENT``, JSON, and the
    connection closes. Nothing was sent to the agent."""
    srv = start_server(tmp_path / "b.db")
    try:
        agent = _agent(srv)
        with _connect(srv) as sock:
            sock.sendall(_head("POST", f"/agents/{agent}/messages", headers) + body)
            sock.shutdown(socket.SHUT_WR)
            status, got, answer = _response(sock)
        assert status == 400, answer
        assert answer["error"]["code"] == "INVALID_ARGUMENT", answer
        assert "body" in answer["error"]["message"], answer
        assert got["Connection"] == "close"
        assert not [e for e in _events(srv, agent) if e["type"] == "message"]
    finally:
        stop_server(srv)


# -- damaged rows -----------------------------------------------------------------------


def test_a_damaged_row_hides_nothing_else(db: str) -> None:
    """One root's header and another root's last event damaged in the store: the
    client's agent listing has the healthy roots and names the damaged one in its
    ``diagnostics``; the session with the damaged event serves every event that
    decodes, and names the damaged seq (both were a 400 ``CORRUPT_RECORD`` for the
    whole answer)."""
    srv = start_server(db)
    try:
        roots = [_agent(srv, f"r{i}") for i in range(3)]
        for root in roots:
            assert srv.call("POST", f"/agents/{root}/messages", {"content": "hi"})[0] == 200
        for root in roots:
            eventually(functools.partial(_ended, srv, root), "the message ran")
        before = _events(srv, roots[1])
    finally:
        stop_server(srv)
    bad = b"\xc1\xc1\xc1"
    key = SessionId(roots[0]).to_bytes()
    assert outside_sql(db, "UPDATE sessions SET header = ? WHERE id = ?", bad, key) == 1
    key = SessionId(roots[1]).to_bytes()
    (damaged,) = [e["seq"] for e in before if e["type"] == "message"]
    update = "UPDATE events SET body = ? WHERE session = ? AND seq = ?"
    assert outside_sql(db, update, bad, key, damaged) == 1
    srv = start_server(db)
    try:
        status, listed = srv.call("GET", "/agents")
        assert status == 200, listed
        assert [a["session_id"] for a in listed["agents"]] == roots[1:]
        (diagnostic,) = listed["diagnostics"]
        assert diagnostic["id"] == roots[0] and diagnostic["kind"] == "corrupt", diagnostic
        assert "CORRUPT_RECORD" in diagnostic["detail"], diagnostic
        status, read = srv.call("GET", f"/sessions/{roots[1]}")
        assert status == 200, read
        # (A stop may have logged more past ``before``: a disposal's, say.)
        assert read["events"][: len(before) - 1] == [e for e in before if e["seq"] != damaged]
        (diagnostic,) = read["diagnostics"]
        assert diagnostic["seq"] == damaged and diagnostic["kind"] == "corrupt", diagnostic
        assert "CORRUPT_RECORD" in diagnostic["detail"], diagnostic
        status, healthy = srv.call("GET", f"/sessions/{roots[2]}")
        assert status == 200 and healthy["diagnostics"] == [], healthy
    finally:
        stop_server(srv)
