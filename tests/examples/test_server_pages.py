"""``GET /sessions/{id}`` of the gevent server example on a long session: pages
(``from_seq``, ``limit``, ``next``), and a read that never stalls the others.

A whole log used to be converted and JSON-encoded on the hub in one answer: a
session of 20,000 turns (some 40 MB) stopped every other request for 4-5 s.
Each server is a real subprocess (``server_kit``); the long session is written
first by a runtime of this process, with its owner row.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

from server_kit import Server, start_server, stop_server
from subagents.actors import Runtime

GATED = Path(__file__).with_name("gated_pages_server.py")


def _long_session(db: Path, turns: int, pad: int = 0) -> str:
    """A top-level session of ``turns`` echo turns (messages ``"i <pad x>"``), owned by
    client ``c``; its id."""
    with Runtime(str(db), durability="relaxed") as rt:
        agent = rt.spawn("echo", label="long")
        for i in range(turns):
            agent.followup(f"{i} {'x' * pad}")
        assert agent.wait_idle(120)
        sid = str(agent.session_id)
    owners = sqlite3.connect(f"{db}.owners")
    owners.execute("CREATE TABLE owners (session_id TEXT PRIMARY KEY, client TEXT, root INT)")
    owners.execute("INSERT INTO owners VALUES (?, 'c', 1)", (sid,))
    owners.commit()
    owners.close()
    return sid


def _page(srv: Server, sid: str, query: str = "") -> dict[str, Any]:
    status, page = srv.call("GET", f"/sessions/{sid}{query}")
    assert status == 200, page
    assert isinstance(page, dict)
    return page


def _pages(srv: Server, sid: str, limit: str = "") -> list[dict[str, Any]]:
    """Every page of the session, following ``next`` from the start."""
    pages = [_page(srv, sid, f"?limit={limit}" if limit else "")]
    while pages[-1].get("next") is not None:
        amp = f"&limit={limit}" if limit else ""
        pages.append(_page(srv, sid, f"?from_seq={pages[-1]['next']}{amp}"))
    return pages


def test_a_long_session_is_read_in_pages(tmp_path: Path) -> None:
    """1,200 turns (3,601 events, the agent's options first): the first page holds
    the first 1,000 events and ``next`` names the seq the second begins at;
    following ``next`` reads every event once, in order, ending with ``next``
    null; ``limit`` sets a page's size (at most 10,000); a bad ``from_seq`` or
    ``limit`` is a 400."""
    sid = _long_session(tmp_path / "l.db", 1200)
    srv = start_server(tmp_path / "l.db")
    try:
        first = _page(srv, sid)
        assert len(first["events"]) == 1000, len(first["events"])
        assert first["next"] == first["events"][-1]["seq"] + 1, first["next"]
        assert first["diagnostics"] == []
        pages = _pages(srv, sid)
        assert [len(p["events"]) for p in pages] == [1000, 1000, 1000, 601]
        seqs = [e["seq"] for p in pages for e in p["events"]]
        assert seqs == list(range(3601)), "each event once, in order"
        assert pages[-1]["next"] is None
        contents = [e["content"] for p in pages for e in p["events"] if e["type"] == "message"]
        assert contents == [f"{i} " for i in range(1200)]
        small = _page(srv, sid, f"?from_seq={seqs[10]}&limit=5")
        assert [e["seq"] for e in small["events"]] == seqs[10:15]
        assert small["next"] == seqs[15]
        assert len(_page(srv, sid, "?limit=10000")["events"]) == 3601
        assert _page(srv, sid, f"?from_seq={seqs[-1] + 1}") == {
            "events": [],
            "diagnostics": [],
            "next": None,
        }
        for bad in ("limit=0", "limit=-1", "limit=x", "limit=10001", "from_seq=-1", "from_seq=a"):
            status, body = srv.call("GET", f"/sessions/{sid}?{bad}")
            assert status == 400, (bad, body)
            assert body["error"]["code"] == "INVALID_ARGUMENT", (bad, body)
    finally:
        stop_server(srv)


def test_reading_a_long_session_stalls_no_other_request(tmp_path: Path) -> None:
    """6,000 turns of 8 KB messages (some 100 MB of JSON) read page by page, at the
    largest pages a client may ask for, while another client asks ``GET /stats``
    over and over: each page is built while a ``/stats`` is answered
    (``gated_pages_server.py`` holds a page's scan until one is, so a page built on
    the hub -- a whole-log read there held every request for seconds -- fails, by
    construction rather than by a wall-clock bound a loaded machine can miss), and
    the pages hold the whole log."""
    sid = _long_session(tmp_path / "b.db", 6000, pad=8000)
    srv = start_server(tmp_path / "b.db", script=GATED)
    try:
        read: list[Any] = []  # the pages, or what the reader raised
        done = threading.Event()

        def reader() -> None:
            try:
                read.append(_pages(srv, sid, "10000"))
            except BaseException as exc:  # raised below, in the test's thread
                read.append(exc)
            finally:
                done.set()

        thread = threading.Thread(target=reader)
        thread.start()
        conn = srv.connect()
        try:
            while not done.is_set():
                assert srv.call("GET", "/stats", conn=conn)[0] == 200
        finally:
            conn.close()
            thread.join()
        (pages,) = read  # each a 200 (``_page``): its scan saw a /stats answered
        if isinstance(pages, BaseException):
            raise pages
        assert sum(len(p["events"]) for p in pages) == 18001
        assert len(pages) > 1, "a page holds a few megabytes at most"
    finally:
        stop_server(srv)
