"""Command-line fixes: ``show`` keeps every map entry, ``tree`` leaves out a session
deleted while it reads and lists a leaf root once, ``tree --watch`` refuses a
malformed ROOT, and ``serve`` answers a request target it cannot split."""

from __future__ import annotations

import datetime as dt
import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from subagents.actors import Runtime
from subagents.actors._catalog import _catalog
from subagents.actors._kernel._backend import Backend
from subagents.actors._shell._cli import main
from subagents.actors._shell._output import dumps
from subagents.protocol import (
    ContinuableDescriptor,
    SessionHeader,
    descriptor_event,
    new_session_id,
)
from subagents.store import SqliteStore

_T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
#: Keys that render alike: 1 and "1", None and "null", b"\x01" and "01".
_ALIKE = {1: "int", "1": "str 1", None: "none", "null": "str null", b"\x01": "bytes", "01": "s01"}


def test_json_keeps_every_entry_of_a_map_whose_keys_render_alike() -> None:
    """A map whose keys collide once rendered is a list of ``[key, value]`` pairs,
    each key rendered as a value is (its entries were overwritten: 6 became 3); a
    map of string keys, or of keys that stay distinct, is still an object."""
    pairs = json.loads(dumps({"content": _ALIKE}))["content"]
    assert pairs == [[1, "int"], ["1", "str 1"], [None, "none"], ["null", "str null"],
                     ["01", "bytes"], ["01", "s01"]]  # fmt: skip
    assert json.loads(dumps({"a": 1, 2: {None: 3}})) == {"a": 1, "2": {"null": 3}}


def test_show_keeps_every_entry_of_content_whose_keys_render_alike(
    tmp_path: Path, backend: Backend, capsys: Any
) -> None:
    """``show --json`` and the text ``show`` print all six entries, exit 0."""
    db = str(tmp_path / "keys.db")
    with Runtime(db, backend=backend) as rt:
        agent = rt.spawn("echo", label="keys")
        agent.followup(_ALIKE)
        agent.wait_idle(10)
        sid = str(agent.session_id)
    assert main(["show", db, sid, "--json"]) == 0
    events = json.loads(capsys.readouterr().out)["events"]
    content = next(e["content"] for e in events if e.get("type") == "message")
    assert len(content) == 6 and ["01", "bytes"] in content and ["01", "s01"] in content
    assert main(["show", db, sid]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if " message " in x)
    for text in ("'int'", "'str 1'", "'none'", "'str null'", "'bytes'", "'s01'"):
        assert text in line, line


def _continuable(label: str) -> Any:
    return descriptor_event(
        ContinuableDescriptor(provider="local", label=label, agent_provider="local", model="echo")
    )


def _header(parent: Any, label: str, n: int) -> SessionHeader:
    return SessionHeader(
        id=new_session_id(),
        parent_session=parent,
        origin="user" if parent is None else "subagent",
        delegation_depth=0 if parent is None else 1,
        created_at=_T0 + dt.timedelta(seconds=n),
        label=label,
    )


def test_tree_leaves_out_a_session_deleted_while_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """R-LIST-16: a child another process deletes after ``tree``'s header scan, before
    its log is read, no longer exists: it is left out, no diagnostic, exit 0 (it
    was an ``unavailable`` diagnostic, ``[SESSION_NOT_FOUND]``, exit 1)."""
    db = str(tmp_path / "del.db")
    root = _header(None, "root", 0)
    doomed, keeper = _header(root.id, "doomed", 1), _header(root.id, "keeper", 2)
    with SqliteStore(db) as store:
        store.create_session(root)
        store.create_session(_header(None, "other", 3))
        store.create_session(doomed, [_continuable("doomed")])
        store.create_session(keeper, [_continuable("keeper")])
    read = SqliteStore.read

    def deleting_read(self: SqliteStore, sid: Any, from_seq: int = 0) -> Any:
        if sid == doomed.id and self.read_only:  # the CLI's store; another one deletes
            with SqliteStore(db) as writer:
                writer.delete_session(doomed.id)
        return read(self, sid, from_seq)

    monkeypatch.setattr(SqliteStore, "read", deleting_read)
    assert main(["tree", db, "--json"]) == 0
    trees = {t["label"]: t for t in json.loads(capsys.readouterr().out)}
    assert [r["label"] for r in trees["root"]["descendants"]] == ["keeper"]
    assert trees["root"]["diagnostics"] == [] and trees["other"]["diagnostics"] == []


def test_tree_watch_refuses_a_malformed_root(tmp_path: Path, capsys: Any) -> None:
    """``tree DB BADROOT --watch`` is refused at once, as ``tree`` and ``serve`` refuse
    it: one ``[INVALID_ARGUMENT]`` line, exit 2 (it watched for ever)."""
    db = str(tmp_path / "w.db")
    with SqliteStore(db) as store:
        store.create_session(_header(None, "root", 0))
    for extra in (["--watch", "0.2", "--count", "3"], ["--watch", "0.2"], ["--count", "2"]):
        assert main(["tree", db, "NOT-A-SESSION-ID", *extra]) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1, err
        assert "[INVALID_ARGUMENT]" in err


def test_tree_lists_a_leaf_root_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """``tree`` lists every tree from its one header scan: a root with no rows (a
    leaf) is not listed again, a read per root (3,000 reads for 3,000 roots)."""
    db = str(tmp_path / "leaves.db")
    with SqliteStore(db) as store:
        store.write_many([("create", _header(None, f"r{i}", i), []) for i in range(30)])
    calls: list[Any] = []
    one = _catalog.Catalog.list_descendants

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return one(self, *args, **kwargs)

    monkeypatch.setattr(_catalog.Catalog, "list_descendants", counted)
    assert main(["tree", db, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 30
    assert calls == []


def test_serve_answers_a_target_it_cannot_split(caplog: pytest.LogCaptureFixture) -> None:
    """A request target urllib cannot split (a broken IPv6 host) is answered 400,
    telling nothing (it got no answer, and a traceback was printed)."""
    from subagents.actors._shell._serve import TreeFeed, TreeServer
    from subagents.store import MemoryStore

    store = MemoryStore()
    store.create_session(_header(None, "secret-label", 0))
    feed = TreeFeed(store, "mem", None, 60.0)
    server = TreeServer(feed, "127.0.0.1", 0, "s3cret")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with socket.create_connection(server.server_address[:2], timeout=10) as sock:
            sock.sendall(b"GET http://[::1/?token=s3cret HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.endswith(b"\n"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
    finally:
        server.shutdown()
        server.server_close()
        feed.close()
        store.close()
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert b"secret-label" not in answer and b"s3cret" not in answer
    assert not [r for r in caplog.records if r.exc_info], caplog.records


def test_show_of_a_session_deleted_while_it_reads_is_not_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """R-LIST-16: ``show`` reads a session's header, then its log. A session another
    process deletes between the two no longer exists: ``SESSION_NOT_FOUND``, exit 2,
    as for one that never did. It printed the header with no events and exited 0,
    a session that seemed to exist with an empty log."""
    db = str(tmp_path / "del.db")
    doomed: list[SessionHeader] = []
    scan = SqliteStore._scan

    def deleting_scan(self: SqliteStore, sid: Any, seq: int) -> Any:
        # After ``scan`` found the session, before it read a row of its log.
        if sid == doomed[-1].id and self.read_only:  # the CLI's; another store deletes
            with SqliteStore(db) as writer:
                writer.delete_session(sid)
        return scan(self, sid, seq)

    monkeypatch.setattr(SqliteStore, "_scan", deleting_scan)
    for extra in ([], ["--json"]):
        doomed.append(_header(None, "doomed", len(doomed)))
        with SqliteStore(db) as store:
            store.create_session(doomed[-1], [_continuable("doomed")])
        assert main(["show", db, str(doomed[-1].id), *extra]) == 2
        out = capsys.readouterr()
        assert "no session" in out.err and "deleted while it was read" in out.err
        assert out.out == ""
