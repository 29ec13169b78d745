"""A runtime's presence on an SQLite file (``SqliteStore.listen``, ``store/_presence.py``):
a socket file any process using the file can ring, and a lock whose end tells
every process on this kernel -- whatever its PID namespace -- that its holder's
process is gone (L-8, R-DUR-*; issue 13: "durable across crashes and
processes"). Real processes, killed with SIGKILL; see also
``tests/durability/test_namespaces.py``.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import MakeEvents, MakeHeader
from subagents.protocol import ErrorCode, SubagentError
from subagents.store import Holder, Presence, SqliteStore, holder_ended, presence_ended

ELSEWHERE = "elsewhere~0.0:1:abc"  # a holder of another host: no pid to judge


@contextmanager
def _holding(db: Path, *mode: str) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """A ``presence_holder.py`` process and the lines it printed (its presence's
    address; with ``fork``, also its child's pid; with ``stall``, only the
    temporary lock file's path)."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("presence_holder.py")), str(db), *mode],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    try:
        lines = [proc.stdout.readline().strip() for _ in range(1 + mode.count("fork"))]
        assert all(lines), proc.stderr.read() if proc.stderr else ""
        yield proc, lines
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def _killed_presence(db: Path) -> str:
    with _holding(db) as (proc, (address,)):
        assert not presence_ended(address)
        proc.kill()
        proc.wait()
    return address


def test_a_presence_lives_with_its_store_and_close_removes_it(sqlite_store: SqliteStore) -> None:
    """Its files are in ``<db>-wake/``; it is not ended while open -- asked from
    this very process too (another descriptor) -- and close removes both files
    (a judge then cannot tell: False). It receives what is rung at its path."""
    presence = sqlite_store.listen()
    assert isinstance(presence, Presence)
    address = presence.address
    assert address.startswith(sqlite_store.path + "-wake/")
    assert os.path.exists(address) and os.path.exists(address + ".lock")
    assert not presence_ended(address)
    assert not holder_ended(ELSEWHERE, address)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.sendto(b"ring", address)
    assert presence.receive() == [b"ring"]
    assert presence.receive() == []
    presence.close()
    presence.close()  # idempotent
    assert not os.path.exists(address) and not os.path.exists(address + ".lock")
    assert not os.path.exists(sqlite_store.path + "-wake")  # left empty: removed
    assert not presence_ended(address)
    assert presence.fileno() is None


def test_a_killed_holders_presence_is_ended(tmp_path: Path) -> None:
    """SIGKILL: the kernel drops the lock; every judge (``presence_ended``,
    ``holder_ended`` and ``Holder.dead`` with the lease's wake) finds it ended,
    though its holder id names another host. Not for addresses of other kinds."""
    address = _killed_presence(tmp_path / "s.db")
    assert presence_ended(address)
    assert holder_ended(ELSEWHERE, address)
    assert Holder().dead(ELSEWHERE, address)
    assert not Holder().dead(ELSEWHERE)
    for other in (None, "@abstract", "pg:subagents_heard_x", str(tmp_path / "nothing"), 7):
        assert not presence_ended(other)  # type: ignore[arg-type]


def test_a_forked_child_does_not_keep_its_parent_present(tmp_path: Path) -> None:
    """A fork after the presence was taken (a server's preforked worker): the child
    lets go of its copy of the lock, so the parent's death ends the presence
    while the child lives on."""
    with _holding(tmp_path / "s.db", "fork") as (proc, (address, child_text)):
        child = int(child_text)
        try:
            assert not presence_ended(address)
            proc.kill()
            proc.wait()
            os.kill(child, 0)  # alive
            assert presence_ended(address)
        finally:
            os.kill(child, signal.SIGKILL)


def test_judges_at_once_agree(tmp_path: Path, sqlite_store: SqliteStore) -> None:
    """Judges share the lock they try: eight threads asking at once, over and over,
    all find an ended presence ended and a live one alive -- never one judge's
    try taken for the holder's lock, nor the holder's for nobody's."""
    ended = _killed_presence(tmp_path / "other.db")
    live = sqlite_store.listen()
    assert live is not None
    answers: list[tuple[bool, bool]] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def judge() -> None:
        start.wait()
        for _ in range(300):
            pair = (presence_ended(ended), presence_ended(live.address))
            with lock:
                answers.append(pair)

    threads = [threading.Thread(target=judge) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    live.close()
    assert set(answers) == {(True, False)}
    assert len(answers) == 2400


def _leased(store: SqliteStore, make_header: MakeHeader, wake: str) -> object:
    header = make_header()
    store.create_session(header)
    now = time.time()
    store.acquire_lease(header.id, ELSEWHERE, now=now, expires=now + 3600, wake=wake)
    return header.id


def test_an_ended_presences_lease_is_taken_over_given_dead(
    sqlite_store: SqliteStore, make_header: MakeHeader, make_events: MakeEvents, tmp_path: Path
) -> None:
    """Its accepted work is listed by ``ended_work``; an acquisition given ``dead``
    takes its lease (whatever ``dead`` says of the id); one without ``dead`` waits
    for the expiry (``LEASE_HELD``). A live presence's lease and work are its own."""
    gone = _leased(sqlite_store, make_header, _killed_presence(tmp_path / "other.db"))
    sqlite_store.accept(gone, make_events(1))
    live_presence = sqlite_store.listen()
    assert live_presence is not None
    live = _leased(sqlite_store, make_header, live_presence.address)
    sqlite_store.accept(live, make_events(1))
    now = time.time()
    assert sqlite_store.ended_work(now) == [(gone, ELSEWHERE)]
    assert sqlite_store.ended_work(now + 7200) == []  # lapsed: an orphan's question
    with pytest.raises(SubagentError) as held:
        sqlite_store.acquire_lease(gone, "here:1:x", now=now, expires=now + 30)
    assert held.value.code is ErrorCode.LEASE_HELD
    lease = sqlite_store.acquire_lease(
        gone, "here:1:x", now=now, expires=now + 30, dead=lambda _holder: False
    )
    assert lease.holder == "here:1:x" and lease.epoch == 2
    with pytest.raises(SubagentError) as kept:
        sqlite_store.acquire_lease(
            live, "here:1:x", now=now, expires=now + 30, dead=lambda _holder: False
        )
    assert kept.value.code is ErrorCode.LEASE_HELD
    live_presence.close()


def test_ended_presences_are_cleared_unless_a_live_lease_names_them(
    sqlite_store: SqliteStore, make_header: MakeHeader
) -> None:
    """A runtime opening the file clears the files of ended presences -- but not
    those a live lease still names (others judge its holder by them), nor a live
    presence's."""
    db = Path(sqlite_store.path)
    named = _killed_presence(db)
    _leased(sqlite_store, make_header, named)
    unnamed = _killed_presence(db)  # (its own opening kept the named one)
    assert os.path.exists(named + ".lock")
    live = sqlite_store.listen()
    assert live is not None
    again = sqlite_store.listen()
    assert again is not None
    assert os.path.exists(named + ".lock") and presence_ended(named)
    assert not os.path.exists(unnamed + ".lock") and not os.path.exists(unnamed)
    assert os.path.exists(live.address + ".lock") and not presence_ended(live.address)
    live.close()
    again.close()


def test_a_presence_a_kill_cut_short_while_made_is_cleared(tmp_path: Path) -> None:
    """A runtime killed (SIGKILL) while it made its presence -- its lock file
    created and locked, not yet renamed into place -- left the temporary file for
    ever, and the meeting place with it. A runtime opening the file removes such
    a file once nobody holds it and it is older than a making takes (its age
    moved back, not waited for); a young one (a making under way, as far as
    anyone can tell) and one somebody holds stay."""
    db = tmp_path / "s.db"
    leftovers = []
    for _ in range(3):
        with _holding(db, "stall") as (proc, (temporary,)):
            proc.kill()
            proc.wait()
        assert os.path.exists(temporary) and temporary.endswith(".tmp")
        leftovers.append(temporary)
    old, _young, held = leftovers
    for path in (old, held):
        past = time.time() - 3600
        os.utime(path, (past, past))
    fd = os.open(held, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # somebody holds it
        with SqliteStore(db) as store:
            live = store.listen()
            assert live is not None
            assert [os.path.exists(p) for p in leftovers] == [False, True, True]
            live.close()
    finally:
        os.close(fd)


def test_no_presence_where_none_can_be_made(tmp_path: Path) -> None:
    """None -- and the runtime keeps its host's doorbell -- for a read-only store,
    where the meeting place cannot be made (a file has its name), and where its
    path is too long for a socket's address."""
    blocked = tmp_path / "blocked.db"
    with SqliteStore(blocked) as store:
        Path(str(blocked) + "-wake").write_text("in the way")
        assert store.listen() is None
    with SqliteStore(blocked, read_only=True) as reader:
        assert reader.listen() is None
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    with SqliteStore(deep / "long.db") as store:
        assert store.listen() is None
        assert not os.path.exists(str(deep / "long.db") + "-wake")
    store = SqliteStore(tmp_path / "closed.db")
    store.close()
    with pytest.raises(SubagentError) as closed:
        store.listen()
    assert closed.value.code is ErrorCode.STORE_CLOSED


def test_a_presence_being_made_is_never_judged_ended(tmp_path: Path) -> None:
    """The lock file is locked under a temporary name and renamed into place: judges
    scanning the meeting place while presences are made (and kept) never find
    one ended -- created at its final name and locked after, some would be."""
    directory = str(tmp_path / "s.db-wake")
    os.makedirs(directory)
    made: list[Presence] = []
    done = threading.Event()
    wrong: list[str] = []

    def judge() -> None:
        while not done.is_set():
            for name in os.listdir(directory):
                if name.endswith(".lock") and presence_ended(os.path.join(directory, name[:-5])):
                    wrong.append(name)

    judges = [threading.Thread(target=judge) for _ in range(3)]
    for t in judges:
        t.start()
    try:
        for _ in range(300):
            presence = Presence.open(directory)
            assert presence is not None
            made.append(presence)
    finally:
        done.set()
        for t in judges:
            t.join()
        for presence in made:
            presence.close()
    assert wrong == []
    assert not os.path.exists(directory)  # the last close took the folder too
