"""A throwaway PostgreSQL cluster for tests, benchmarks and CI.

``start()`` runs ``initdb`` into a new temporary directory and ``pg_ctl start`` on a
free loopback port (trust authentication, nothing listening beyond 127.0.0.1),
and returns a :class:`Cluster` whose ``url`` a store opens. PostgreSQL refuses to
run as root: as root, every server command runs as the ``postgres`` system user
(``su``) in a directory that user owns. ``destroy()`` stops the server (``-m
immediate``) and removes the directory; ``restart()`` stops and starts it on the
same port (a server restart in the middle of a test).

``start(owner_pid=PID)`` also leaves a watcher behind: a detached process that
destroys the cluster when process PID ends without doing so itself (a test worker
killed by SIGKILL or ended by ``os._exit`` on a timeout runs no cleanup).

From a shell (``.ci/run``)::

    python tests/pgcluster.py start DIR   # prints the url; DIR must not exist
    python tests/pgcluster.py stop DIR
    python tests/pgcluster.py watch PID DIR   # what start(owner_pid=PID) runs
"""

from __future__ import annotations

import glob
import os
import select
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["Cluster", "bindir", "start"]


def bindir() -> str | None:
    """Where ``initdb`` and ``pg_ctl`` are (None: no PostgreSQL server installed)."""
    try:
        out = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=True
        ).stdout.strip()
        if os.path.exists(os.path.join(out, "initdb")):
            return out
    except (OSError, subprocess.CalledProcessError):
        pass
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Cluster:
    """A running throwaway cluster (see the module docstring)."""

    def __init__(self, base: Path, port: int, bin_dir: str) -> None:
        self.base = base
        self.port = port
        self.bin = bin_dir
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [os.path.join(self.bin, argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            cmd = ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(cmd)]
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=120)

    def start(self) -> None:
        """Start the server (waits until it accepts connections)."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.base}"
            " -c max_connections=300 -c shared_buffers=64MB"
        )
        done = self._run(
            "pg_ctl", "-D", str(self.base / "data"), "-l", str(self.base / "log"),
            "-o", options, "-w", "-t", "60", "start", check=False,
        )  # fmt: skip
        if done.returncode != 0:
            log = (self.base / "log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"pg_ctl start failed: {done.stdout}{done.stderr}\n{log}")

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (``immediate``: like a crash, no checkpoint)."""
        self._run("pg_ctl", "-D", str(self.base / "data"), "-m", mode, "-w", "stop", check=False)

    def restart(self) -> None:
        """Stop (fast) and start again on the same port."""
        self.stop("fast")
        self.start()

    def destroy(self) -> None:
        """Stop the server and remove its directory."""
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)


def start(base: str | os.PathLike[str] | None = None, *, owner_pid: int | None = None) -> Cluster:
    """Create and start a cluster in ``base`` (a new temporary directory by default).
    With ``owner_pid``, a watcher destroys it once that process has ended.

    Raises:
        RuntimeError: no PostgreSQL server on this machine, or it failed to start.
    """
    bin_dir = bindir()
    if bin_dir is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb) on this machine")
    path = Path(base) if base is not None else Path(tempfile.mkdtemp(prefix="subagents-pg-"))
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")
        path.chmod(0o700)
    cluster = Cluster(path, _free_port(), bin_dir)
    done = cluster._run(
        "initdb", "-D", str(path / "data"), "-U", "postgres", "--auth=trust",
        "-E", "UTF8", "--no-sync", check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"initdb failed: {done.stdout}{done.stderr}")
    (path / "port").write_text(str(cluster.port))
    if owner_pid is not None:
        # Before the server starts: an owner killed from here on leaves nothing.
        # The command forks the watcher off and returns: nothing of ours stays a
        # child (a Popen collected while its process runs is a ResourceWarning).
        subprocess.run(
            [sys.executable, os.path.abspath(__file__), "watch", str(owner_pid), str(path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, check=True, timeout=60,
        )  # fmt: skip
    cluster.start()
    return cluster


def outside_sql(db: str, statement: str, *params: object) -> int:
    """Run one ``?``-placeholder statement on a store's rows from outside the store
    (``db``: an SQLite path or a ``postgresql://...?schema=`` URL); the row count."""
    if db.startswith("postgresql"):
        import psycopg

        base, _, schema = db.partition("?schema=")
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            return conn.execute(statement.replace("?", "%s"), params).rowcount
    import sqlite3

    conn3 = sqlite3.connect(db)
    try:
        with conn3:
            return conn3.execute(statement, params).rowcount
    finally:
        conn3.close()


def _wait_for_exit(pid: int) -> None:
    """Block until process ``pid`` has ended (a pidfd: no polling while it lives)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def _destroy(base: Path) -> None:
    bin_dir = bindir()
    if bin_dir is not None and (base / "port").exists():
        Cluster(base, int((base / "port").read_text()), bin_dir).destroy()


def _main(argv: list[str]) -> int:
    if argv[:1] == ["watch"] and len(argv) == 3:
        if os.fork():
            return 0
        _wait_for_exit(int(argv[1]))
        _destroy(Path(argv[2]))  # gone already when the owner cleaned up itself
        return 0
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print(__doc__, file=sys.stderr)
        return 2
    base = Path(argv[1])
    if argv[0] == "start":
        print(start(base).url)
        return 0
    _destroy(base)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
