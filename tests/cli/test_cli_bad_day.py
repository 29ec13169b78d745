"""The command line on a bad day: ``tree`` and ``show`` when the store fails
under them or cannot be opened at all (one line on stderr and exit 2, never a
tree of per-session errors, a state read from half the data, or a traceback),
a URL libpq reads and urllib does not, ``serve`` on IPv6's loopback, and a
Ctrl-C while the command still starts."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from subagents.actors._shell._cli import main
from subagents.protocol import (
    ContinuableDescriptor,
    MessageEvent,
    SessionHeader,
    TurnEnd,
    TurnStart,
    descriptor_event,
    new_message_id,
    new_session_id,
)
from subagents.store import PostgresStore, SqliteStore, redacted_url

_T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
_CLI = "import sys; from subagents.actors._shell._cli import main; sys.exit(main())"
_TESTS = str(Path(__file__).resolve().parents[1])

#: A ``subagents`` process whose store's server is stopped (immediate: a crash)
#: when the command reaches ``TARGET`` (``module:Class.method``): an ordering
#: forced from inside the command, no sleep.
_STOPPING_CLI = """
import importlib, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
import pgcluster
from subagents.actors._shell._cli import main
cluster = pgcluster.Cluster(Path({base!r}), {port!r}, {bin!r})
module, _, name = {target!r}.partition(":")
owner_name, _, method = name.partition(".")
owner = getattr(importlib.import_module(module), owner_name)
original = getattr(owner, method)
def stopping(*args, **kwargs):
    cluster.stop("immediate")
    return original(*args, **kwargs)
setattr(owner, method, stopping)
sys.exit(main({argv!r}))
"""


def _store_with_trees(url: str) -> str:
    """Three trees of a root and two children, each with a turn and a queued
    message; the first root's id."""
    kid = ContinuableDescriptor(provider="local", label="c", agent_provider="local", model="echo")
    ops: list[tuple[Any, ...]] = []
    roots: list[SessionHeader] = []
    for i in range(3):
        root = SessionHeader(
            id=new_session_id(),
            parent_session=None,
            origin="user",
            delegation_depth=0,
            created_at=_T0,
            label=f"r{i}",
        )
        roots.append(root)
        ops.append(("create", root, []))
        for j in range(2):
            child = SessionHeader(
                id=new_session_id(),
                parent_session=root.id,
                origin="subagent",
                delegation_depth=1,
                created_at=_T0 + dt.timedelta(seconds=j),
            )
            ops.append(("create", child, [descriptor_event(kid)]))
    with PostgresStore(url) as store:
        store.write_many(ops)
        for op in ops:
            sid = op[1].id
            mid = new_message_id()
            store.append(
                sid,
                [
                    TurnStart(turn=0, at=_T0, message_ids=(mid,)),
                    MessageEvent(message_id=mid, content="hello"),
                    TurnEnd(turn=0, at=_T0, stop_reason="completed"),
                ],
            )
            store.accept(sid, [MessageEvent(message_id=new_message_id(), content="later")])
    return str(roots[0].id)


@pytest.mark.parametrize(
    ("command", "target"),
    [
        # The catalog's listing: each session's log read fails.
        ("tree", "subagents.actors._shell._tree:_Trees.list_all"),
        # The logs and inboxes read ahead, a window of sessions at a time.
        ("tree", "subagents.actors._shell._tree:_Trees.prefetch"),
        ("tree --json", "subagents.actors._shell._tree:_Trees.prefetch"),
        # ``show``: the log is read, then the inbox.
        ("show", "subagents.store:PostgresStore.pending"),
    ],
)
def test_a_server_that_goes_away_mid_command_is_one_line(
    own_pg_server: Any, command: str, target: str
) -> None:
    """PostgreSQL stopped while ``tree`` or ``show`` reads (R-ERR-1; R-LIST-15:
    the catalog's per-session ``unavailable`` diagnostic, which ``tree`` turns into its
    failure when the code says the store is down): the command
    prints nothing on stdout, one line ``subagents CMD: [PERSISTENCE_UNAVAILABLE]
    ...`` on stderr (no read pool warning per reconnection attempt) and exits 2.
    It printed a tree whose every session had an ``[unavailable]`` diagnostic, or
    states read from half the data (a session whose inbox could not be read
    ``settled``, its queued message lost), and exited 1 or 0 as for damaged or
    whole records."""
    url = f"{own_pg_server.url}?schema=s_{uuid.uuid4().hex[:12]}"
    root = _store_with_trees(url)
    words = command.split()
    argv = [words[0], url, *([root] if words[0] == "show" else []), *words[1:]]
    code = _STOPPING_CLI.format(
        tests=_TESTS,
        base=str(own_pg_server.base),
        port=own_pg_server.port,
        bin=own_pg_server.bin,
        target=target,
        argv=argv,
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "200"},
        )
    finally:
        own_pg_server.start()
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"subagents {words[0]}: [PERSISTENCE_UNAVAILABLE] "), lines
    assert done.stdout == "", done.stdout
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)


@pytest.mark.parametrize("command", ["tree", "show", "demo"])
def test_a_schema_whose_text_does_not_decode_is_database_corrupt(
    tmp_path: Path, command: str
) -> None:
    """A byte of a table's name in SQLite's schema overwritten with one that is no
    UTF-8 (R-ERR-1): SQLite's ``malformed database schema (...)`` quotes it, and
    Python's sqlite3 failed to decode that message -- a ``UnicodeDecodeError``
    traceback from ``tree``, ``show`` and ``demo``. Each now prints one line
    ``[DATABASE_CORRUPT]`` naming the file, exits 2 and leaves the file untouched."""
    db = tmp_path / "s.db"
    header = SessionHeader(
        id=new_session_id(),
        parent_session=None,
        origin="user",
        delegation_depth=0,
        created_at=_T0,
    )
    with SqliteStore(str(db)) as store:
        store.write_many([("create", header, [])])
    con = sqlite3.connect(db)
    con.execute("pragma wal_checkpoint(truncate)")
    con.close()
    data = bytearray(db.read_bytes())
    # The schema row of schema_version: type, name, tbl_name, then its SQL.
    at = data.find(b"tableschema_versionschema_version")
    assert at > 0
    data[at + len("tables")] = 0x8C  # "s\x8chema_version": not UTF-8
    db.write_bytes(bytes(data))
    argv = {
        "tree": ["tree", str(db)],
        "show": ["show", str(db), str(header.id)],
        "demo": ["demo", "--db", str(db)],
    }[command]
    done = subprocess.run(
        [sys.executable, "-c", _CLI, *argv], capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"subagents {command}: [DATABASE_CORRUPT] "), lines
    assert "malformed database schema" in lines[0], lines
    assert done.returncode == 2, (done.returncode, done.stdout)
    assert db.read_bytes() == bytes(data)  # left untouched


def test_a_unix_socket_url_opens_the_store(own_pg_server: Any, capsys) -> None:
    """libpq's URL of a Unix socket, ``postgresql:///DB?host=/socket/dir`` (an empty
    authority), opens the store (R-ERR-1): the ``schema`` parameter was taken out
    by ``urlunsplit``, which made it ``postgresql:/DB?host=...`` -- an "invalid
    connection option" for libpq, from ``tree`` as from ``Runtime``. An error
    line prints the URL with its ``//`` and its password masked."""
    schema = f"s_{uuid.uuid4().hex[:12]}"
    root = _store_with_trees(f"{own_pg_server.url}?schema={schema}")
    socket_url = (
        f"postgresql:///postgres?host={own_pg_server.base}&port={own_pg_server.port}"
        f"&user=postgres&schema={schema}"
    )
    assert main(["tree", socket_url, root, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["id"] == root
    missing = socket_url.replace(schema, "no_such_schema") + "&password=hush"
    assert main(["tree", missing]) == 2
    err = capsys.readouterr().err
    assert "[NOT_A_DATABASE]" in err and "postgresql:///postgres?host=" in err, err
    assert "hush" not in err and "password=***" in err, err


def test_a_url_that_cannot_be_split_is_one_line(tmp_path: Path) -> None:
    """A PostgreSQL URL urllib cannot split (an unclosed ``[`` of an IPv6 host)
    is ``INVALID_ARGUMENT`` in one line, its password masked (R-ERR-1); it was a
    ``ValueError`` traceback."""
    url = "postgresql://app:hush@[::1:5432/agents?schema=demo"
    for argv in (["tree", url], ["show", url, "0" * 32], ["serve", url, "--port", "0"]):
        done = subprocess.run(
            [sys.executable, "-c", _CLI, *argv], capture_output=True, text=True, timeout=120
        )
        assert "Traceback" not in done.stderr, done.stderr
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and "[INVALID_ARGUMENT]" in lines[0], done.stderr
        assert "hush" not in done.stderr and "app:***@[::1:5432" in lines[0], lines
        assert done.returncode == 2
    assert redacted_url(url) == "postgresql://app:***@[::1:5432/agents?schema=demo"
    assert redacted_url("postgresql:///db?host=/run/pg&password=x") == (
        "postgresql:///db?host=/run/pg&password=***"
    )


def test_a_url_naming_its_schema_twice_is_refused() -> None:
    """``?schema=a&schema=b``: which one was meant? libpq would take the last, our
    parse took the first, silently -- it is ``INVALID_ARGUMENT`` now, naming no
    password, and no store is opened (R-ERR-1)."""
    from subagents.protocol import ErrorCode, SubagentError
    from subagents.store import PostgresStore

    url = "postgresql://app:hush@127.0.0.1:1/agents?schema=a&schema=b"
    with pytest.raises(SubagentError) as err:
        PostgresStore(url)
    assert err.value.code == ErrorCode.INVALID_ARGUMENT
    assert "2 times" in str(err.value) and "hush" not in str(err.value)


def test_serve_binds_the_ipv6_loopback() -> None:
    """``serve --host ::1`` listens on IPv6's loopback and prints a URL a client
    can open (``http://[::1]:PORT/``); it was refused as "Address family for
    hostname not supported" (http.server binds IPv4 only) (R-ERR-1)."""
    from subagents.actors._shell._serve import TreeFeed, TreeServer
    from subagents.store import MemoryStore

    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    store = MemoryStore()
    feed = TreeFeed(store, "mem", None, 60.0)
    try:
        server = TreeServer(feed, "::1", 0, None)
    except OSError:
        feed.close()
        store.close()
        raise
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert server.url.startswith("http://[::1]:"), server.url
        with urllib.request.urlopen(server.url + "tree.json", timeout=30) as response:
            frame = json.loads(response.read())
    finally:
        server.shutdown()
        server.server_close()
        feed.close()
        store.close()
    assert frame == {"db": "mem", "error": None, "trees": []}


#: A ``subagents`` process that is sent SIGINT while it imports its command line
#: (an import hook sends it): the ordering forced, no sleep.
_INTERRUPTED_AT_START = """
import os, signal, sys
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "subagents.actors._shell._cli":
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Interrupt())
from subagents._entry import main
sys.exit(main())
"""


def test_a_ctrl_c_while_the_command_starts_is_one_line(tmp_path: Path) -> None:
    """SIGINT while ``subagents`` still imports its modules (a few tenths of a
    second) ends it as a later Ctrl-C does: ``interrupted`` on stderr, exit 130
    (R-ERR-1); it printed the traceback of the import it landed in. The
    installed command and ``python -m subagents`` run this entry point."""
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_AT_START, "tree", str(tmp_path / "x.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stderr, done.stdout) == (130, "interrupted\n", "")
    main_module = Path(_TESTS).parent / "command" / "__main__.py"
    assert "from subagents._entry import main" in main_module.read_text()
    config = (Path(_TESTS).parent / "setup.cfg").read_text()
    assert "subagents = subagents._entry:main" in config


def test_a_wait_longer_than_a_thread_can_make_is_refused(tmp_path: Path, capsys) -> None:
    """``tree --watch 1e308`` and ``serve --interval 1e308`` are INVALID_ARGUMENT
    in one line (R-ERR-1): ``tree`` printed its first frame, then an
    OverflowError traceback from the sleep; ``serve``'s poller thread died of it
    (a traceback on stderr) and the server went on serving the first frame for
    ever. The longest wait a thread makes, ``threading.TIMEOUT_MAX``, is taken."""
    db = str(tmp_path / "w.db")
    with SqliteStore(db):
        pass
    assert main(["tree", db, "--watch", "1e308", "--count", "2"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "", captured.out
    assert "[INVALID_ARGUMENT] --watch takes seconds > 0 (at most" in captured.err
    done = subprocess.run(
        [sys.executable, "-c", _CLI, "serve", db, "--port", "0", "--interval", "1e308"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "[INVALID_ARGUMENT] --interval takes seconds" in lines[0], lines
    assert main(["tree", db, "--watch", str(threading.TIMEOUT_MAX), "--count", "1"]) == 0
    assert capsys.readouterr().out.endswith("no sessions\n")
