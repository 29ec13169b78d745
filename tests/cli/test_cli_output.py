"""What the command line prints is safe to read and honest about how it ended:
a URL's password never shows (also as a query parameter), a label cannot forge a
line or send a terminal escape, an error is one line, and a reader that leaves
(``| head``) neither fails the command nor cuts the demo short."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors._shell._cli import main
from subagents.actors._shell._tree_text import printable
from subagents.store import redacted_url

_CLI = "import sys; from subagents.actors._shell._cli import main; sys.exit(main())"


def test_redacted_url_masks_every_password() -> None:
    url = "postgresql://u:pw1@h:5432/x?sslmode=require&password=hunter2&sslpassword=k3y"
    shown = redacted_url(url)
    assert shown == "postgresql://u:***@h:5432/x?sslmode=require&password=***&sslpassword=***"
    plain = "postgresql://u@h/x?passfile=/home/u/.pgpass&application_name=a"
    assert redacted_url(plain) == plain
    assert redacted_url("postgresql://h/x?Password=a%20b") == "postgresql://h/x?Password=***"


def test_an_error_line_masks_a_query_password(capsys) -> None:
    """The error of a server that refuses the connection is one line on stderr,
    its URL's ``?password=`` masked."""
    url = "postgresql://u@127.0.0.1:1/x?password=hunter2&connect_timeout=2"
    assert main(["tree", url]) == 2
    out, err = capsys.readouterr()
    assert "hunter2" not in out + err and "password=***" in err
    assert len(err.strip().splitlines()) == 1, err


def test_labels_cannot_forge_lines_or_reach_the_terminal(
    tmp_path: Path, backend: Backend, capsys
) -> None:
    db = str(tmp_path / "labels.db")
    with Runtime(db, backend=backend) as rt:
        rt.spawn("echo", label="root\nfake-line  continuable  settled")
        rt.spawn("echo", label="\x1b[2J\x1b[31mred\u202e")
    assert main(["tree", db]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out
    assert not any(line.startswith("fake-line") for line in out.splitlines())
    assert "root\\nfake-line" in out and "\\x1b[2J\\x1b[31mred\\u202e" in out
    assert printable("caf\u00e9 \U0001f600 tab\there") == "caf\u00e9 \U0001f600 tab\\there"


def _first_line_then_leave(args: list[str]) -> tuple[int, str]:
    """Run the command, read one line of its output, close the pipe; its exit
    status and stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLI, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    with proc.stdout, proc.stderr:
        assert proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read()
    return proc.wait(timeout=120), err


def test_a_reader_that_leaves_ends_nothing_early(tmp_path: Path, backend: Backend) -> None:
    """``subagents demo | head -1`` builds the whole tree and exits 0 (it stopped
    part way, exit 1, and later runs only resumed the part); ``show | head -1``
    exits 0 (exit 1 with nothing on stderr)."""
    db = str(tmp_path / "pipe.db")
    status, err = _first_line_then_leave(["demo", "--db", db, "--backend", backend.name])
    assert (status, err) == (0, "")
    again = subprocess.run(
        [sys.executable, "-c", _CLI, "demo", "--db", db, "--backend", backend.name],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "resumed: 11 sessions" in again.stdout, again.stdout + again.stderr
    with Runtime(db, backend=backend) as rt:
        root = next(h.id for h in rt.agents.roots() if h.label == "demo-root")
    status, err = _first_line_then_leave(["show", db, str(root)])
    assert (status, err) == (0, "")


def test_json_output_renders_keys_as_it_renders_values() -> None:
    """``--json`` of content whose map keys are no strings: bytes keys in hex as
    bytes values are (they came out as ``"b'\\x01\\x02'"``), others as their JSON
    text; the output parses with a strict reader."""
    import json

    from subagents.actors._shell._output import dumps

    text = dumps({b"\x01\x02": b"\x03", None: 1, 3: 2, True: 3, 1.5: 4, float("nan"): 5, "k": 6})
    assert json.loads(text) == {"0102": "03", "null": 1, "3": 2, "true": 3, "1.5": 4,
                                "NaN": 5, "k": 6}  # fmt: skip
