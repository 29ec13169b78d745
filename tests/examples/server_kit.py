"""Running ``examples/gevent_server.py`` as a real subprocess, and calling it over HTTP.

Shared by ``test_examples.py`` and ``load_server.py`` (a script: run it from the
repository's root, ``python tests/examples/load_server.py``).
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TOKEN = "t0ken"


def eventually(probe: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll ``probe`` until it returns something truthy (a deadline, not a timing)."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got or time.monotonic() > deadline:
            assert got, what
            return got
        time.sleep(0.02)


def strict_json(raw: bytes) -> Any:
    """Parse a response as standard JSON: ``NaN`` or ``Infinity`` in it fail the test."""

    def refuse(name: str) -> Any:
        raise AssertionError(f"the server sent non-standard JSON: {name}")

    return json.loads(raw or b"null", parse_constant=refuse)


class Server:
    def __init__(self, proc: subprocess.Popen[str], port: int, stderr: IO[bytes]) -> None:
        self.proc = proc
        self.port = port
        self.stderr = stderr  # a file, not a pipe: a server logging a lot never blocks on it

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        client: str = "c",
        token: str | None = TOKEN,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        conn: http.client.HTTPConnection | None = None,
    ) -> tuple[int, Any]:
        """One request; on ``conn`` (kept open: keep-alive) or a new connection."""
        own = conn is None
        c = self.connect() if conn is None else conn
        try:
            sent = {"X-Client-Id": client}
            if token is not None:
                sent["Authorization"] = f"Bearer {token}"
            sent.update(headers or {})
            data = (
                raw
                if raw is not None
                else (json.dumps(body).encode() if body is not None else None)
            )
            c.request(method, path, body=data, headers=sent)
            response = c.getresponse()
            return response.status, strict_json(response.read())
        finally:
            if own:
                c.close()


def start_server(db: Path | str, *args: str, script: Path | None = None) -> Server:
    """The example server on a free port, on store ``db``, with ``args`` added
    (``script``: a script that runs it, instead of ``gevent_server.py`` itself)."""
    stderr = tempfile.TemporaryFile()  # noqa: SIM115 -- closed by stop_server
    proc = subprocess.Popen(
        [
            sys.executable,
            str(script or EXAMPLES / "gevent_server.py"),
            "--port",
            "0",
            "--db",
            str(db),
            "--token",
            TOKEN,
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    server = Server(proc, 0, stderr)
    if not line.startswith("listening on http://127.0.0.1:"):
        stop_server(server)
        raise AssertionError(line)
    server.port = int(line.rsplit(":", 1)[1])
    return server


def stop_server(server: Server, *, tracebacks: int | None = 0) -> str:
    """SIGTERM, as a process manager would; the server must exit cleanly, having
    logged ``tracebacks`` tracebacks (none, unless a test provoked some; ``None``:
    the test looks at them itself). Its stderr."""
    proc = server.proc
    proc.terminate()
    try:
        proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
    server.stderr.seek(0)
    err = server.stderr.read().decode(errors="replace")
    server.stderr.close()
    assert tracebacks is None or err.count("Traceback") == tracebacks, err
    assert proc.returncode == 0, err
    return err
