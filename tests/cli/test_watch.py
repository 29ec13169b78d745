"""``subagents tree --watch``: the trees shown again as they change (issue 18 point 5).

A watcher is a separate process, as a person runs it; the test drives a runtime
on the same file and reads the watcher's frames (piped: one after another, each
headed by a ``--- HH:MM:SS DB ---`` line; on a terminal: rich's live display).
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors._kernel._gate import Gate
from subagents.actors._shell._cli import main

pytestmark = pytest.mark.timeout(90)

COMMAND = [sys.executable, "-m", "subagents", "tree"]


def _frames(text: str) -> list[str]:
    return text.split("--- ")[1:]


def test_count_frames_when_piped(tmp_path: Path, backend: Backend, capsys: Any) -> None:
    """``--count N`` prints N frames and exits with the tree's status."""
    db = str(tmp_path / "w.db")
    with Runtime(db, backend=backend) as rt:
        rt.spawn("echo", label="watched")
    capsys.readouterr()
    assert main(["tree", db, "--watch", "0.01", "--count", "3"]) == 0
    frames = _frames(capsys.readouterr().out)
    assert len(frames) == 3
    assert all("watched" in f and db in f.splitlines()[0] for f in frames)


def test_a_root_not_there_yet_is_a_line_and_the_watch_goes_on(
    tmp_path: Path, backend: Backend, capsys: Any
) -> None:
    """A ROOT the store does not hold (yet) is each frame's one line; the watch
    goes on, as ``serve`` waits for it (it exited 2 at once); the last frame's
    status is 1."""
    db = str(tmp_path / "w.db")
    with Runtime(db, backend=backend) as rt:
        rt.spawn("echo", label="other")
    capsys.readouterr()
    assert main(["tree", db, "0" * 32, "--watch", "0.01", "--count", "2"]) == 1
    out, err = capsys.readouterr()
    frames = _frames(out)
    assert len(frames) == 2 and err == ""
    assert all(f.splitlines()[1].startswith("[SESSION_NOT_FOUND] /") for f in frames)


@pytest.mark.parametrize(
    "args",
    [["--watch", "0"], ["--watch", "-1"], ["--watch", "nan"], ["--watch", "inf"],
     ["--watch", "1", "--count", "0"], ["--watch", "1", "--json"]],
)  # fmt: skip
def test_bad_watch_arguments(
    tmp_path: Path, backend: Backend, args: list[str], capsys: Any
) -> None:
    """Bad intervals, counts, or ``--json`` with ``--watch``: one line, exit 2."""
    db = str(tmp_path / "w.db")
    with Runtime(db, backend=backend):
        pass
    assert main(["tree", db, *args]) == 2
    assert "INVALID_ARGUMENT" in capsys.readouterr().err


def test_a_session_id_after_watch_is_the_root(
    tmp_path: Path, backend: Backend, capsys: Any
) -> None:
    """``tree DB --watch ROOT``: ``--watch`` takes an optional SECONDS, and a session
    id after it is the ROOT (it was read as the seconds: "invalid float value"),
    even one made of decimal digits only, which reads as a number."""
    db = str(tmp_path / "w.db")
    with Runtime(db, backend=backend) as rt:
        root = rt.spawn("echo", label="first").session_id
        rt.spawn("echo", label="second")
    capsys.readouterr()
    assert main(["tree", db, "--watch", root, "--count", "1"]) == 0
    frame = _frames(capsys.readouterr().out)[0]
    assert "first" in frame and "second" not in frame
    digits = "1" * 32  # a well-formed id no session has (yet): the frame says so
    assert main(["tree", db, "--count", "1", "--watch", digits]) == 1
    assert f"[SESSION_NOT_FOUND] {db}: no session {digits}" in capsys.readouterr().out
    assert main(["tree", db, "--watch", "0.01", root, "--count", "1"]) == 0
    assert "second" not in capsys.readouterr().out


def test_a_watcher_sees_a_child_appear_and_change_state(
    tmp_path: Path, backend: Backend, start_os_thread: Callable[..., Any]
) -> None:
    """A watching process shows a continuable child appear while its turn runs
    (``running``) and then settle, as the runtime in this process drives it."""
    db = str(tmp_path / "w.db")
    gate = Gate("child turn")

    def child(turn: Any) -> Any:
        gate.pass_through(turn.signal)
        return "done"

    with Runtime(db, backend=backend) as rt:
        rt.models.register("child", lambda _o: child)
        root = rt.spawn("echo", label="root")
        rt.sessions.flush()
        proc = subprocess.Popen(
            [*COMMAND, db, "--watch", "0.05", "--count", "2000"],
            stdout=subprocess.PIPE,
            text=True,
        )
        seen: list[str] = []
        reader = start_os_thread(lambda: seen.extend(iter(proc.stdout.readline, "")))

        def until(check: Callable[[str], bool]) -> str:
            deadline = time.monotonic() + 60
            while True:
                frames = _frames("".join(seen))
                if frames[:-1] and check(frames[-2]):  # the last one may be partial
                    return frames[-2]
                assert time.monotonic() < deadline, "".join(seen)[-2000:]
                backend.sleep(0.02)

        try:
            until(lambda f: "root" in f and "late-child" not in f)
            from subagents.actors import ContinuableStartSpec

            rt.subagents.start_continuable(
                ContinuableStartSpec(
                    parent=root, provider="local", prompt="go", label="late-child", model="child"
                )
            )
            assert gate.wait_reached(30)
            rt.sessions.flush()
            until(lambda f: "late-child  continuable  running" in f)
            gate.release()
            rt.wait_idle(30)
            rt.sessions.flush()
            until(lambda f: "late-child  continuable  settled" in f)
        finally:
            proc.terminate()
            proc.wait(30)
            reader.join(30)
            assert proc.stdout is not None
            proc.stdout.close()


def test_the_live_display_on_a_terminal(tmp_path: Path, backend: Backend) -> None:
    """On a terminal the frames are redrawn in place (rich's live display)."""
    db = str(tmp_path / "w.db")
    with Runtime(db, backend=backend) as rt:
        rt.spawn("echo", label="on-a-tty")
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [*COMMAND, db, "--watch", "0.05", "--count", "3"],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env={**os.environ, "TERM": "xterm", "COLUMNS": "200"},
    )
    os.close(follower)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], 30)
            assert ready, out[-2000:]
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed its side
                break
            if not chunk:
                break
            out += chunk
    finally:
        assert proc.wait(30) == 0
        os.close(leader)
    text = out.decode(errors="replace")
    assert "on-a-tty" in text
    assert "\x1b[" in text  # redrawn in place: cursor movements
