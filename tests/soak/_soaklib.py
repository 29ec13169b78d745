"""Shared pieces of the crash soak: the side-record writer, the readers of a run's
files, and a read-only store for the checker.

A run directory holds ``side_<name>_<pid>.jsonl`` (one line per call and per turn
event, appended and fsynced by each process), ``topo.jsonl`` (roots and children
as they were made), ``kills.jsonl`` (the driver's SIGKILLs and SIGSTOP/SIGCONT
windows), ``db.txt`` (the store's location) and ``workers.log``. A killed process
may leave a torn last line: every reader skips a line that does not parse.
"""

from __future__ import annotations

import glob
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["Recorder", "load_kills", "load_side", "open_read_only", "read_jsonl"]


class Recorder:
    """Appends one JSON line per record to a file, fsynced before returning.

    Each record gets ``k`` (its kind), ``proc`` (``NAME.PID``), ``pid``, ``c`` (a
    per-process counter: the order records were made in) and ``t`` (wall clock).
    """

    def __init__(self, path: str, proc: str, backend: str) -> None:
        self.proc = proc
        self.pid = os.getpid()
        self.backend = backend
        self._lock = threading.Lock()
        self._count = 0
        self._fd = self.open_append(path)

    @staticmethod
    def open_append(path: str) -> int:
        """An append-only descriptor (whole lines from several processes interleave)."""
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, kind: str, fd: int | None = None, **fields: Any) -> None:
        """Write one record to this recorder's file, or to ``fd`` (the topology file)."""
        with self._lock:
            self._count += 1
            fields.update(
                k=kind,
                proc=self.proc,
                pid=self.pid,
                c=self._count,
                t=time.time(),
                backend=self.backend,
            )
            out = self._fd if fd is None else fd
            os.write(out, (json.dumps(fields, default=str) + "\n").encode())
            os.fsync(out)


def read_jsonl(path: str) -> Iterator[dict[str, Any]]:
    """The records of one file; a torn line (a process killed mid-write) is skipped."""
    try:
        with open(path) as f:
            for line in f:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue
    except FileNotFoundError:
        return


def load_side(run_dir: str, name: str = "*") -> list[dict[str, Any]]:
    """Every side record of a run (or of the processes of one worker ``name``)."""
    out: list[dict[str, Any]] = []
    for path in sorted(glob.glob(os.path.join(run_dir, f"side_{name}_*.jsonl"))):
        out.extend(read_jsonl(path))
    return out


def load_kills(run_dir: str) -> tuple[dict[str, float], dict[str, list[tuple[float, float]]]]:
    """The driver's kills by pid (when), and its stalls by pid (SIGSTOP, SIGCONT)."""
    kills: dict[str, float] = {}
    stalls: dict[str, list[tuple[float, float]]] = {}
    for d in read_jsonl(os.path.join(run_dir, "kills.jsonl")):
        if "stop" in d:
            stalls.setdefault(str(d["pid"]), []).append((d["stop"], d["cont"]))
        else:
            kills[str(d["pid"])] = d["t"]
    return kills, stalls


def open_read_only(db: str) -> Any:
    """The run's store, read-only (as ``subagents tree`` opens it): the checker
    takes no lease, writes nothing and resumes nothing."""
    from subagents.store import SqliteStore, is_postgres_url

    if is_postgres_url(db):
        from subagents.store import PostgresStore

        return PostgresStore(db, create=False, read_only=True)
    return SqliteStore(db, read_only=True)
