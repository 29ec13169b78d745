"""``subagents tree``, ``show`` and ``serve`` read a database; they never write it
nor take its write lock: a worker's long write transaction does not hold them up
(they waited 30 s for it, then failed), a listing caches nothing in the file, and
a file its reader may not write is still read."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._shell._cli import main
from subagents.protocol import ErrorCode, SubagentError
from subagents.store import SqliteStore

_CLI = "import sys; from subagents.actors._shell._cli import main; sys.exit(main())"


def _tree_db(path: Path) -> str:
    db = str(path)
    with Runtime(db) as rt:
        parent = rt.spawn("echo", label="parent")
        rt.subagents.start_continuable(
            ContinuableStartSpec(parent=parent, provider="local", prompt="p", label="child")
        )
        assert rt.wait_idle(10)
    return db


def test_a_held_write_lock_does_not_hold_the_commands_up(tmp_path: Path, capsys) -> None:
    db = _tree_db(tmp_path / "busy.db")
    writer = sqlite3.connect(db, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # a worker in the middle of a write
        writer.execute("DELETE FROM projection_cache")  # (uncommitted: nothing cached)
        assert main(["tree", db, "--json"]) == 0
        out = capsys.readouterr().out
        assert '"label": "child"' in out
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_a_listing_writes_nothing(tmp_path: Path, capsys) -> None:
    db = _tree_db(tmp_path / "quiet.db")
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM projection_cache")
    conn.close()
    before = Path(db).read_bytes()
    assert main(["tree", db]) == 0
    assert main(["tree", db, "--json"]) == 0
    capsys.readouterr()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM projection_cache").fetchone()[0] == 0
    conn.close()
    assert Path(db).read_bytes() == before


def test_a_read_only_store_refuses_writes(tmp_path: Path) -> None:
    db = _tree_db(tmp_path / "ro.db")
    with SqliteStore(db, read_only=True) as store:
        assert store.read_only
        (sid,) = [h.id for h in store.all_headers() if h.label == "parent"]
        assert store.header(sid) is not None
        with pytest.raises(SubagentError) as err:
            store.put_projection(sid, "subagent", 0, b"x")
        assert err.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
    with pytest.raises(SubagentError) as err:
        SqliteStore(str(tmp_path / "missing.db"), read_only=True)
    assert err.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(SubagentError) as err:
        SqliteStore(db, read_only="yes")  # type: ignore[arg-type]
    assert err.value.code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root, to read as an unprivileged user",
)
def test_a_file_in_a_directory_the_reader_cannot_write() -> None:
    """As ``nobody``: a database it may read and not write, in a directory it may
    not write (SQLite can make no ``-shm`` there) -- ``tree`` and ``show`` read it
    (they failed: "attempt to write a readonly database")."""
    # Under /tmp: the test's own directory is its owner's alone.
    home = Path(tempfile.mkdtemp(prefix="subagents-ro-", dir="/tmp"))
    try:
        db = _tree_db(home / "tree.db")
        with SqliteStore(db) as store:
            (sid,) = [h.id for h in store.all_headers() if h.label == "child"]
        for p in (home, *home.iterdir()):
            p.chmod(0o755 if p.is_dir() else 0o644)
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        for args in (["tree", db], ["show", db, str(sid)]):
            done = subprocess.run(
                [*as_nobody, sys.executable, "-c", _CLI, *args],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if "Permission denied" in done.stderr and "python" in done.stderr.lower():
                pytest.skip("nobody cannot run this interpreter here")
            assert done.returncode == 0, done.stderr
            assert "child" in done.stdout
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root, to act as two unprivileged users",
)
def test_another_users_read_leaves_the_owner_able_to_write() -> None:
    """The file's owner wrote it and closed (no WAL left); another user reads it in
    a directory both may write: the reader leaves no WAL or index of its own
    behind (the owner's next writes failed: "attempt to write a readonly
    database")."""
    home = Path(tempfile.mkdtemp(prefix="subagents-ro-", dir="/tmp"))
    try:
        home.chmod(0o1777)
        db = str(home / "x.db")
        owner = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        reader = ["setpriv", "--reuid=12345", "--regid=12345", "--clear-groups"]
        write = (
            "import sys; from subagents.actors import Runtime\n"
            "with Runtime(sys.argv[1]) as rt:\n"
            "    a = rt.spawn('echo', label='x'); a.followup('hi'); assert a.wait_idle(10)\n"
        )

        def run(who: list[str], *args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*who, sys.executable, *args], capture_output=True, text=True, timeout=60
            )

        first = run(owner, "-c", write, db)
        if "Permission denied" in first.stderr and "python" in first.stderr.lower():
            pytest.skip("an unprivileged user cannot run this interpreter here")
        assert first.returncode == 0, first.stderr
        shown = run(reader, "-c", _CLI, "tree", db)
        assert shown.returncode == 0, shown.stderr
        assert "x  " in shown.stdout
        assert sorted(p.name for p in home.iterdir()) == ["x.db"]
        again = run(owner, "-c", write, db)
        assert again.returncode == 0, again.stderr
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_postgres_reader_neither_migrates_nor_writes(pg_url: str, capsys: Any) -> None:
    """``tree`` on PostgreSQL opens the store read-only: a write fails, and a schema
    of an older version is refused and left as it is (``tree`` migrated it, which a
    SELECT-only role could not)."""
    import psycopg
    from subagents.store import PostgresStore

    with Runtime(pg_url) as rt:
        rt.spawn("echo", label="pg-root")
    assert main(["tree", pg_url]) == 0
    assert "pg-root" in capsys.readouterr().out
    with PostgresStore(pg_url, read_only=True) as store:
        (sid,) = [h.id for h in store.all_headers()]
        with pytest.raises(SubagentError) as err:
            store.put_projection(sid, "subagent", 0, b"x")
        assert err.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
    base, schema = pg_url.split("?schema=")
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'UPDATE "{schema}".subagents_schema SET version = version - 1')
    assert main(["tree", pg_url]) == 2
    assert "older than" in capsys.readouterr().err
    with psycopg.connect(base, autocommit=True) as conn:
        (version,) = conn.execute(f'SELECT version FROM "{schema}".subagents_schema').fetchone()
        conn.execute(f'UPDATE "{schema}".subagents_schema SET version = version + 1')
    from subagents.store._pg_schema import PG_SCHEMA_VERSION

    assert version == PG_SCHEMA_VERSION - 1  # untouched
