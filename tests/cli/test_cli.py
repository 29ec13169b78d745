"""The ``subagents`` command line: demo (first run and resume), show, errors."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors._shell._cli import main
from subagents.protocol import SubagentError
from subagents.store import PostgresStore, open_store


def test_demo_builds_then_resumes(tmp_path: Path, backend: Backend, capsys) -> None:
    """The demo builds a tree of at least 3 levels, and a second run resumes it."""
    db = str(tmp_path / "demo.db")
    assert main(["demo", "--db", db, "--backend", backend.name]) == 0
    first = capsys.readouterr().out
    assert "building one" in first and "created: 11 sessions" in first
    for label in ("researcher-A", "researcher-B", "writer", "fact-checker", "lookup", "sketch-0"):
        assert label in first
    assert "cancelled" in first  # the interrupted researcher and the drained sketches
    # A finished one-shot is `ended`, in the words of `subagents tree` and the README.
    assert re.search(r"lookup\s.*one-shot\s.*ended", first), first
    assert main(["demo", "--db", db, "--backend", backend.name]) == 0
    second = capsys.readouterr().out
    assert "resuming it" in second
    assert "cold-resumed researcher-A" in second and "cold-resumed writer" in second
    assert "resumed: 11 sessions" in second


def test_demo_in_a_file_in_use_counts_and_shows_its_own_tree(
    tmp_path: Path, backend: Backend, capsys
) -> None:
    """``--db`` names a file that holds other sessions: the demo shows and counts
    its own tree only. It said "created: 16 sessions", and listed the others."""
    db = str(tmp_path / "shared.db")
    with Runtime(db, backend=backend) as rt:
        for i in range(5):
            rt.spawn("echo", label=f"someone-else-{i}")
    assert main(["demo", "--db", db, "--backend", backend.name]) == 0
    out = capsys.readouterr().out
    assert "created: 11 sessions" in out and "someone-else" not in out, out


@pytest.mark.slow
def test_two_demo_runs_at_once_on_a_new_file_build_one_tree(db: str, backend: Backend) -> None:
    """Issue 13 point 4: two ``subagents demo`` processes started together on one new
    file build one tree -- one creates it, the other waits for its lease and
    resumes it; the file then holds exactly one tree of 11 sessions. The same on
    a new PostgreSQL schema (issue 14 point 7)."""
    cmd = [sys.executable, "-c", _CLI, "demo", "--db", db, "--backend", backend.name]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, (out, err)
        assert "Traceback" not in err, err
    texts = sorted(out for out, _ in outs)
    built = [t for t in texts if "building one" in t]
    resumed = [t for t in texts if "resuming it" in t]
    assert len(built) == 1 and len(resumed) == 1, texts
    assert "created: 11 sessions" in built[0]
    assert "resumed: 11 sessions" in resumed[0]
    store = open_store(db)
    assert store is not None
    try:
        roots, total = len(store.list_headers(None)), len(store.all_headers())
    finally:
        store.close()
    assert (roots, total) == (2, 11)  # the demo root and its side project


@pytest.mark.parametrize("damage", ["random", "foreign", "pages", "events-row"])
def test_demo_on_a_damaged_file_is_one_typed_line(tmp_path: Path, damage: str) -> None:
    """Issue 13 point 8: ``subagents demo`` on a damaged or foreign database prints
    one line naming the error code and exits non-zero -- never a traceback, never 0."""
    db = tmp_path / "demo.db"
    if damage == "random":
        db.write_bytes(os.urandom(100_000))
    elif damage == "foreign":
        con = sqlite3.connect(db)
        con.execute("create table t(x)")
        con.commit()
        con.close()
    else:
        assert main(["demo", "--db", str(db)]) == 0
        con = sqlite3.connect(db)
        con.execute("pragma wal_checkpoint(truncate)")
        con.close()
        if damage == "pages":
            with db.open("r+b") as f:
                f.seek(8192)
                f.write(b"\xff" * 8192)
        else:
            con = sqlite3.connect(db)
            con.execute("update events set body = x'c1c1c1'")
            con.commit()
            con.close()
    out = subprocess.run(
        [sys.executable, "-c", _CLI, "demo", "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("subagents demo: ["), out.stderr


_CLI = "import sys; from subagents.actors._shell._cli import main; sys.exit(main())"


def _a_session(db: str) -> str:
    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
        table = "sessions" if "sessions" in tables else tables[0]
        row = con.execute(f"select id from {table} limit 1").fetchone()
    finally:
        con.close()
    value = row[0]
    return value.hex() if isinstance(value, bytes) else str(value)


def test_show_prints_events_and_json(tmp_path: Path, capsys) -> None:
    db = str(tmp_path / "demo.db")
    assert main(["demo", "--db", db]) == 0
    capsys.readouterr()
    sid = _a_session(db)
    assert main(["show", db, sid]) == 0
    text = capsys.readouterr().out
    assert f"session {sid}" in text
    assert main(["show", db, sid, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["header"]["id"] == sid
    assert all("seq" in e for e in data["events"])


@pytest.mark.parametrize("kind", ["missing", "empty", "random", "foreign", "directory"])
def test_show_bad_files_one_line_error(tmp_path: Path, kind: str, capsys) -> None:
    """Missing, empty, corrupt or foreign: one line, non-zero, no traceback, file untouched."""
    path = tmp_path / "x.db"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "random":
        path.write_bytes(os.urandom(4096))
    elif kind == "foreign":
        con = sqlite3.connect(path)
        con.execute("create table t(x)")
        con.commit()
        con.close()
    elif kind == "directory":
        path.mkdir()
    before = path.read_bytes() if path.is_file() else None
    code = main(["show", str(path), "0" * 32])
    err = capsys.readouterr().err
    assert code != 0
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    if before is not None:
        assert path.read_bytes() == before
    if kind == "missing":
        assert not path.exists()


def test_show_unknown_session_and_bad_id(tmp_path: Path, capsys) -> None:
    db = str(tmp_path / "demo.db")
    assert main(["demo", "--db", db]) == 0
    capsys.readouterr()
    assert main(["show", db, "f" * 32]) != 0
    assert "no session" in capsys.readouterr().err
    assert main(["show", db, "not-an-id"]) != 0
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_help_for_every_command() -> None:
    for args in ([], ["demo"], ["show"], ["tree"]):
        out = subprocess.run(
            [sys.executable, "-m", "subagents.actors._shell._cli", *args, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0 and "usage:" in out.stdout


def test_tree_prints_the_catalog(tmp_path: Path, capsys) -> None:
    """``subagents tree DB`` shows every tree; ``--json`` matches; ROOT narrows it."""
    db = str(tmp_path / "demo.db")
    assert main(["demo", "--db", db]) == 0
    capsys.readouterr()
    assert main(["tree", db]) == 0
    text = capsys.readouterr().out
    for label in (
        "demo-root",
        "researcher-A",
        "fact-checker",
        "lookup",
        "side-project",
        "sketch-2",
    ):
        assert label in text
    assert "continuable" in text and "one-shot" in text and "active" in text
    assert main(["tree", db, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    roots = {r["label"]: r for r in data}
    assert set(roots) == {"demo-root", "side-project"}
    demo = roots["demo-root"]
    depths = {d["label"]: d["depth"] for d in demo["descendants"]}
    assert depths["researcher-A"] == 1 and depths["fact-checker"] == 2 and depths["lookup"] == 3
    assert main(["tree", db, roots["side-project"]["id"], "--json"]) == 0
    only = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in only] == ["side-project"]
    assert len(only[0]["descendants"]) == 3
    # Options before ROOT too (argparse alone refused it: "unrecognized arguments").
    assert main(["tree", db, "--json", roots["side-project"]["id"]]) == 0
    assert json.loads(capsys.readouterr().out) == only
    with pytest.raises(SystemExit) as exited:
        main(["tree", db, "--json", roots["side-project"]["id"], "extra"])
    assert exited.value.code == 2
    assert "unrecognized arguments: extra" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["missing", "empty", "random"])
def test_tree_bad_files(tmp_path: Path, kind: str, capsys) -> None:
    path = tmp_path / "x.db"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "random":
        path.write_bytes(os.urandom(2048))
    assert main(["tree", str(path)]) != 0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_demo_tree_and_show_on_postgres(pg_url: str, backend: Backend, capsys) -> None:
    """Issue 14 point 7: ``demo --db postgresql://...`` builds, then resumes; ``tree``
    and ``show`` read the same URL as they read a file; a schema holding no store
    is one line and a non-zero exit, and is not created."""
    assert main(["demo", "--db", pg_url, "--backend", backend.name]) == 0
    assert "created: 11 sessions" in capsys.readouterr().out
    assert main(["demo", "--db", pg_url, "--backend", backend.name]) == 0
    second = capsys.readouterr().out
    assert "resumed: 11 sessions" in second and "cold-resumed writer" in second
    assert main(["tree", pg_url, "--json"]) == 0
    roots = {r["label"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(roots) == {"demo-root", "side-project"}
    depths = {d["label"]: d["depth"] for d in roots["demo-root"]["descendants"]}
    assert depths["researcher-A"] == 1 and depths["lookup"] == 3
    sid = roots["side-project"]["id"]
    assert main(["show", pg_url, sid, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["header"]["id"] == sid
    elsewhere = pg_url.rsplit("=", 1)[0] + "=t_no_store_here"
    assert main(["tree", elsewhere]) != 0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "NOT_A_DATABASE" in err
    assert main(["show", elsewhere, sid]) != 0
    capsys.readouterr()
    with pytest.raises(SubagentError):
        PostgresStore(elsewhere, create=False)  # still nothing there


def test_a_password_in_a_postgres_url_is_never_printed(
    pg_url: str, backend: Backend, capsys
) -> None:
    """``demo``, ``tree`` (text, ``--json``, ``--watch``) and an error line name the
    database with its password masked (the demo printed it three times)."""
    secret = "s3cret-pw"
    url = pg_url.replace("postgres@", f"postgres:{secret}@", 1)  # trust auth: accepted
    assert secret in url
    assert main(["demo", "--db", url, "--backend", backend.name]) == 0
    assert main(["tree", url]) == 0
    assert main(["tree", url, "--json"]) == 0
    assert main(["tree", url, "--watch", "0.01", "--count", "1"]) == 0
    assert main(["tree", url, "0" * 32]) == 2
    assert main(["show", url, "0" * 32]) == 2
    out, err = capsys.readouterr()
    assert secret not in out + err
    assert ":***@" in out and ":***@" in err


def test_version_bare_command_and_python_m(tmp_path: Path) -> None:
    """Issue 17 point 2: ``subagents --version``, ``python -m subagents`` and a bare
    ``subagents`` (help, exit 0) -- as real processes, the way a user types them."""
    from importlib.metadata import version

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False
        )

    exe = Path(sys.executable).parent / "subagents"
    for command in ([str(exe)], [sys.executable, "-m", "subagents"]):
        out = run(*command, "--version")
        assert (out.returncode, out.stdout.strip()) == (0, f"subagents {version('subagents')}")
        bare = run(*command)
        assert bare.returncode == 0, bare.stderr
        assert bare.stdout.startswith("usage: subagents") and "demo" in bare.stdout
        assert bare.stderr == ""


@pytest.mark.parametrize(
    ("argv", "again"),
    [
        ([], "subagents demo"),
        (["--backend", "gevent"], "subagents demo --backend gevent"),
        (["--db", "{db}"], "subagents demo --db {db}"),
        (["--db", "{db}", "--backend", "gevent"], "subagents demo --db {db} --backend gevent"),
    ],
)
def test_demo_hint_repeats_its_options(
    tmp_path: Path, argv: list[str], again: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The first run's closing hint is the command that resumes the same tree."""
    monkeypatch.chdir(tmp_path)
    db = str(tmp_path / "my tree.db")
    args = [a.replace("{db}", db) for a in argv]
    assert main(["demo", *args]) == 0
    out = capsys.readouterr().out
    quoted = again.replace("{db}", f"'{db}'")
    assert f"run `{quoted}` again to resume this tree" in out
    assert main(["demo", *args]) == 0
    resumed = capsys.readouterr().out
    assert "again to resume" not in resumed and "look at it: `subagents tree " in resumed


def test_an_unfinished_first_run_is_built_again(tmp_path: Path, backend: Backend, capsys) -> None:
    """A first run that stopped part way (here: after the root planned, before the
    side project) left children waiting on steps no later run takes; the next run
    builds the tree again instead of resuming the part (which waited 30 s on the
    researcher the first run never interrupted), and the run after resumes it."""
    from subagents.actors import Runtime
    from subagents.actors._shell import _demo

    db = str(tmp_path / "partial.db")
    script = _demo._Script()
    with Runtime(db, backend=backend) as rt:
        _demo._register(rt, script)
        root = rt.spawn("lead", label=_demo.ROOT_LABEL, session_id=_demo.ROOT_ID)
        root.followup("plan")
        assert script.slow_started.wait_reached(10)  # stopped here: the runtime closes
    assert main(["demo", "--db", db, "--backend", backend.name]) == 0
    first = capsys.readouterr().out
    assert "found an unfinished demo tree" in first and "created: 11 sessions" in first
    assert main(["demo", "--db", db, "--backend", backend.name]) == 0
    second = capsys.readouterr().out
    assert "resuming it" in second and "resumed: 11 sessions" in second
