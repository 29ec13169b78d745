"""The examples run for real: the tree script, and the gevent server under HTTP load."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_kit import EXAMPLES, TOKEN, Server, start_server, stop_server


def test_agent_tree_script(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "agent_tree.py"), str(tmp_path / "tree.db")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "researcher (continuable" in out.stdout
    assert "collected:" in out.stdout  # the quiet report reached the root's next turn


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path / "s.db")
    try:
        yield srv
    finally:
        stop_server(srv)


def _turn_message_ids(srv: Server, child: str, client: str) -> list[str]:
    status, data = srv.call("GET", f"/sessions/{child}", client=client)
    assert status == 200, data
    return [m for e in data["events"] if e["type"] == "turn/start" for m in e["message_ids"]]


def test_server_under_concurrent_clients(server: Server) -> None:
    """50 concurrent clients: each accepted message runs once; the server stays responsive."""
    accepted: dict[tuple[str, str], list[str]] = {}
    lock = threading.Lock()
    errors: list[str] = []
    latencies: list[float] = []
    stop = threading.Event()

    def client(i: int) -> None:
        name = f"client-{i}"
        try:
            status, agent = server.call("POST", "/agents", {"label": f"boss-{i}"}, client=name)
            assert status == 200, agent
            aid = agent["session_id"]
            for j in range(2):
                status, child = server.call(
                    "POST",
                    f"/agents/{aid}/children",
                    {"prompt": f"p{j}", "label": f"k{j}"},
                    client=name,
                )
                assert status == 200, child
                ids = [child["message_id"]]
                for k in range(4):
                    status, res = server.call(
                        "POST",
                        f"/agents/{aid}/children/{child['child_id']}/followup",
                        {"content": k},
                        client=name,
                    )
                    assert status == 200, res
                    ids.append(res["message_id"])
                status, res = server.call(
                    "POST", f"/agents/{aid}/children/{child['child_id']}/interrupt", {}, client=name
                )
                assert status == 200, res
                with lock:
                    accepted[(name, child["child_id"])] = ids
            status, listing = server.call("GET", f"/agents/{aid}/children", client=name)
            assert status == 200 and len(listing["rows"]) + len(listing["diagnostics"]) <= 2, (
                listing
            )
            status, listing = server.call("GET", f"/agents/{aid}/descendants", client=name)
            assert status == 200, listing
        except Exception as exc:  # collected and asserted in the main thread
            with lock:
                errors.append(f"{name}: {exc!r}")

    def prober() -> None:
        while not stop.is_set():
            start = time.monotonic()
            status, _ = server.call("GET", "/agents/" + "0" * 32 + "/children", client="prober")
            latencies.append(time.monotonic() - start)
            assert status == 404

    probe = threading.Thread(target=prober)
    probe.start()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    probe.join(30)
    assert not errors, errors[:5]
    assert len(accepted) == 100
    assert latencies and max(latencies) < 5.0, max(latencies)
    deadline = time.monotonic() + 60
    for (name, child), ids in accepted.items():
        while True:
            claimed = _turn_message_ids(server, child, name)
            if all(claimed.count(m) == 1 for m in ids) or time.monotonic() > deadline:
                break
            time.sleep(0.05)  # polling the server for completion, not ordering
        assert sorted(claimed) == sorted(ids), (child, claimed, ids)


def test_server_errors_are_4xx_with_codes(server: Server) -> None:
    status, body = server.call("POST", "/agents", {"label": "x"}, token=None)
    assert status == 401 and body["error"]["code"] == "UNAUTHENTICATED"
    status, body = server.call("POST", "/agents", {"label": "x"}, token="wrong")
    assert status == 401 and body["error"]["message"] == "the bearer token is not valid"
    status, agent = server.call("POST", "/agents", {"label": "x"})
    aid = agent["session_id"]
    status, body = server.call("POST", f"/agents/{aid}/children", raw=b"{not json")
    assert status == 400 and body["error"]["code"] == "INVALID_ARGUMENT"
    status, body = server.call("POST", f"/agents/{aid}/children", raw=b"[1, 2]")
    assert status == 400
    status, body = server.call("POST", f"/agents/{aid}/children", {"prompt": "p", "label": ""})
    assert 400 <= status < 500 and body["error"]["code"] == "DESCRIPTOR_INVALID"
    status, body = server.call(
        "POST", "/agents/" + "f" * 32 + "/children", {"prompt": "p", "label": "l"}
    )
    assert status == 404 and body["error"]["code"] == "SESSION_NOT_FOUND"
    status, body = server.call("POST", "/agents/nothex/children/alsonot/followup", {"content": 1})
    assert 400 <= status < 500
    status, body = server.call("GET", f"/agents/{aid}/children", client="intruder")
    assert status == 404  # another client's agent is invisible
    status, body = server.call("GET", "/no/such/route")
    assert status == 404


def test_event_stream(server: Server) -> None:
    status, agent = server.call("POST", "/agents", {"label": "streamer"}, client="s")
    aid = agent["session_id"]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request(
        "GET", "/events?limit=2", headers={"Authorization": f"Bearer {TOKEN}", "X-Client-Id": "s"}
    )
    response = conn.getresponse()
    assert response.status == 200
    assert json.loads(response.readline())["type"] == "subscribed"
    status, child = server.call(
        "POST", f"/agents/{aid}/children", {"prompt": "go", "label": "k"}, client="s"
    )
    assert status == 200
    lines = [json.loads(response.readline()) for _ in range(2)]
    conn.close()
    assert [e["type"] for e in lines] == ["subagent/start", "subagent/end"]
    assert {e["child_id"] for e in lines} == {child["child_id"]}


def test_an_event_stream_whose_client_left_is_closed(tmp_path: Path) -> None:
    """A client that leaves a quiet ``/events`` stream: the next heartbeat's write
    fails and the stream's subscription goes (without one it stayed until an event
    for that client came, so a quiet server piled them up)."""
    server = start_server(tmp_path / "s.db", "--heartbeat", "0.05")
    try:
        conns = []
        for i in range(5):
            conn = server.connect()
            conn.request(
                "GET",
                "/events",
                headers={"Authorization": f"Bearer {TOKEN}", "X-Client-Id": f"c{i}"},
            )
            response = conn.getresponse()
            assert json.loads(response.readline())["type"] == "subscribed"
            assert json.loads(response.readline())["type"] == "heartbeat"
            conns.append((conn, response))
        assert server.call("GET", "/stats")[1]["event_streams"] == 5
        for conn, response in conns:
            response.close()
            conn.close()
        deadline = time.monotonic() + 30  # the server's own heartbeats notice it
        while server.call("GET", "/stats")[1]["event_streams"]:
            assert time.monotonic() < deadline, "streams of clients gone are still open"
            time.sleep(0.05)
    finally:
        stop_server(server)


def test_server_binds_loopback_by_default() -> None:
    source = (EXAMPLES / "gevent_server.py").read_text()
    assert 'default="127.0.0.1"' in source
    assert os.path.exists(EXAMPLES / "agent_tree.py")


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_a_restarted_server_serves_the_sessions_it_created(
    request: pytest.FixtureRequest, tmp_path: Path, store: str
) -> None:
    """Issue 13 point 7 over real HTTP: start, create, stop, start, follow up. The
    restarted server lists the client's agents, resumes the top-level agent from
    its recorded model, follows its child up (a cold resume) and messages the
    agent itself; another client still sees none of it. On SQLite and on
    PostgreSQL (issue 14 point 6)."""
    db = tmp_path / "restart.db" if store == "sqlite" else request.getfixturevalue("pg_url")
    srv = start_server(db)
    try:
        status, made = srv.call("POST", "/agents", {"label": "keeper"}, client="alice")
        assert status == 200, made
        agent = made["session_id"]
        status, kid = srv.call(
            "POST", f"/agents/{agent}/children", {"prompt": "first", "label": "kid"}, client="alice"
        )
        assert status == 200, kid
        child = kid["child_id"]
    finally:
        stop_server(srv)
    srv = start_server(db)
    try:
        status, listed = srv.call("GET", "/agents", client="alice")
        assert status == 200, listed
        assert [a["session_id"] for a in listed["agents"]] == [agent]
        assert srv.call("GET", "/agents", client="mallory")[1] == {"agents": [], "diagnostics": []}
        status, sent = srv.call(
            "POST",
            f"/agents/{agent}/children/{child}/followup",
            {"content": "second"},
            client="alice",
        )
        assert status == 200, sent
        status, direct = srv.call(
            "POST", f"/agents/{agent}/messages", {"content": "hello me"}, client="alice"
        )
        assert status == 200, direct
        status, refused = srv.call(
            "POST", f"/agents/{agent}/messages", {"content": "x"}, client="mallory"
        )
        assert status == 404, refused
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # polling a server over HTTP, as a client would
            ran = _turn_message_ids(srv, child, "alice")
            mine = _turn_message_ids(srv, agent, "alice")
            if sent["message_id"] in ran and direct["message_id"] in mine:
                break
            time.sleep(0.05)
        assert ran.count(sent["message_id"]) == 1
        assert len(ran) == 2
        assert mine.count(direct["message_id"]) == 1
    finally:
        stop_server(srv)


def test_two_servers_on_one_postgres_store_serve_one_tree(pg_url: str) -> None:
    """Issue 14 point 6 over real HTTP: two server processes on one PostgreSQL store,
    no balancer; the client alternates between their ports. The tree lives where it
    was made (server A); every follow-up sent to either server reaches the child
    exactly once, in the order sent -- one retried on the other server with the
    same ``message_id`` too -- and either server lists the tree."""
    a, b = start_server(pg_url), start_server(pg_url)
    try:
        status, made = a.call("POST", "/agents", {"label": "shared"}, client="alice")
        assert status == 200, made
        agent = made["session_id"]
        status, kid = a.call(
            "POST", f"/agents/{agent}/children", {"prompt": "p", "label": "kid"}, client="alice"
        )
        assert status == 200, kid
        child = kid["child_id"]
        sent: list[str] = [kid["message_id"]]
        for i in range(10):
            srv = (a, b)[i % 2]
            body: dict[str, Any] = {"content": f"m{i}", "message_id": f"{i + 1:032x}"}
            status, got = srv.call(
                "POST", f"/agents/{agent}/children/{child}/followup", body, client="alice"
            )
            assert status == 200, got
            assert got["message_id"] == body["message_id"]
            sent.append(got["message_id"])
            if i == 4:  # a client retry, to the other server: accepted once
                other = (b, a)[i % 2]
                status, again = other.call(
                    "POST", f"/agents/{agent}/children/{child}/followup", body, client="alice"
                )
                assert (status, again["message_id"]) == (200, body["message_id"])
        status, refused = b.call(
            "POST", f"/agents/{agent}/children/{child}/followup", {"content": "x"}, client="eve"
        )
        assert status == 404, refused
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # polling a server over HTTP, as a client would
            ran = _turn_message_ids(b, child, "alice")
            if len(ran) >= len(sent):
                break
            time.sleep(0.05)
        assert ran == sent
        status, listing = b.call("GET", f"/agents/{agent}/children", client="alice")
        assert status == 200, listing
        assert [r["id"] for r in listing["rows"]] == [child]
        assert _interrupted_elsewhere(a, b, agent, child) == "kid was interrupted"
        other = _started_elsewhere(a, b, agent)
        status, listing = a.call("GET", f"/agents/{agent}/children", client="alice")
        assert sorted(r["id"] for r in listing["rows"]) == sorted([child, other])
    finally:
        stop_server(a)
        stop_server(b)


def _started_elsewhere(a: Server, b: Server, agent: str) -> str:
    """A child of ``agent`` (whose tree lives in ``a``) started through ``b`` -- it was
    409 ``LEASE_HELD`` before starts by the parent's id -- and retried through ``a``
    with the same ``message_id``: one child, whose prompt runs once. Its id."""
    body = {"prompt": "hello", "label": "second", "message_id": f"{99:032x}"}
    status, kid = b.call("POST", f"/agents/{agent}/children", body, client="alice")
    assert status == 200, kid
    status, again = a.call("POST", f"/agents/{agent}/children", body, client="alice")
    assert (status, again) == (200, kid)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # polling a server over HTTP, as a client would
        status, data = a.call("GET", f"/sessions/{kid['child_id']}", client="alice")
        assert status == 200, data
        ends = [e for e in data["events"] if e["type"] == "turn/end"]
        if ends:
            assert [e["stop_reason"] for e in ends] == ["completed"]
            return str(kid["child_id"])
        time.sleep(0.05)
    raise AssertionError("the child started through the other server did not run")


def _interrupted_elsewhere(a: Server, b: Server, agent: str, child: str) -> Any:
    """A long turn of ``child`` (whose tree lives in ``a``), interrupted through ``b``:
    the client asks again until a turn ends (an interrupt that arrives before the
    turn began cuts nothing, as for a child live where it is asked). The output of
    that turn, which must be the interrupted one, long before its 30 s of work."""
    path = f"/agents/{agent}/children/{child}"
    status, got = a.call("POST", f"{path}/followup", {"content": {"work": 30}}, client="alice")
    assert status == 200, got
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status, done = b.call("POST", f"{path}/interrupt", {}, client="alice")
        assert (status, done) == (200, {"interrupted": child})
        status, data = b.call("GET", f"/sessions/{child}", client="alice")
        assert status == 200, data
        ends = [e for e in data["events"] if e["type"] == "turn/end"]
        if len(ends) == 12:  # the prompt's turn, ten follow-ups, then this one
            assert ends[-1]["stop_reason"] == "cancelled", ends[-1]
            return ends[-1]["output"]
        time.sleep(0.05)  # polling a server over HTTP, as a client would
    raise AssertionError("the turn was not interrupted")


def test_a_server_on_postgres_outlives_a_database_restart(own_pg_server: Any) -> None:
    """The server's ownership table on PostgreSQL used one connection that was
    never made again: after the database restarted, every request asking who owns
    a session answered 500 until the server itself was restarted. Now the
    connection is made again, and the requests go on."""
    import uuid

    url = f"{own_pg_server.url}?schema=s_{uuid.uuid4().hex[:12]}"
    srv = start_server(url)
    try:
        status, made = srv.call("POST", "/agents", {"label": "kept"}, client="alice")
        assert status == 200, made
        own_pg_server.restart()
        status, listed = srv.call("GET", "/agents", client="alice")
        assert status == 200, listed
        assert [a["session_id"] for a in listed["agents"]] == [made["session_id"]]
        status, again = srv.call("POST", "/agents", {"label": "new"}, client="alice")
        assert status == 200, again
        assert srv.call("GET", "/agents", client="mallory")[1] == {"agents": [], "diagnostics": []}
    finally:
        stop_server(srv)
