"""``subagents serve DB``: the trees, live, in a web page (issue 18 point 4).

The server is a separate process, as a person runs it; a runtime in this process
drives a tree on the same file. The page is read by a real headless browser --
the system's Chromium and ChromeDriver (``apt-get install chromium
chromium-driver``), driven by Selenium -- which watches a continuable child
appear on the page running and then settle. Without a browser the browser test
skips, unless ``SUBAGENTS_REQUIRE_BROWSER`` is set (CI sets it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors._kernel._gate import Gate
from subagents.actors._shell._cli import main

pytestmark = pytest.mark.timeout(120)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
TOKEN = "s3cret-token"


class _Server:
    """A ``subagents serve`` process; ``url`` is the address it printed."""

    def __init__(self, db: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "subagents", "serve", db, "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("serving http://127.0.0.1:"), (line, self.proc.stderr.read())
        self.url = line.split()[1]
        self.stderr = ""

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url + path.lstrip("/"), headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def stop(self) -> None:
        self.proc.terminate()
        _out, self.stderr = self.proc.communicate(timeout=30)


@pytest.fixture
def blocked_child() -> Iterator[tuple[Gate, Any]]:
    """A model whose turn waits on a gate (released at the end, whatever happens)."""
    gate = Gate("child turn")

    def child(turn: Any) -> Any:
        gate.pass_through(turn.signal)
        return "done"

    yield gate, child
    gate.release()


def test_routes_and_the_token(tmp_path: Path, backend: Backend) -> None:
    """Every route wants the token (bearer header, or ``?token=`` for what a
    browser opens); the snapshot is ``tree --json``'s reading; nothing else exists."""
    db = str(tmp_path / "s.db")
    with Runtime(db, backend=backend) as rt:
        root = rt.spawn("echo", label="served-root")
    server = _Server(db, "--token", TOKEN, "--interval", "0.05")
    try:
        assert server.get("/")[0] == 401
        assert server.get("/tree.json")[0] == 401
        assert server.get("/?token=wrong")[0] == 401
        assert server.get("/", {"Authorization": "Bearer wrong"})[0] == 401
        status, page = server.get(f"/?token={TOKEN}")
        assert status == 200 and b"EventSource" in page
        status, body = server.get("/tree.json", {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200
        frame = json.loads(body)
        assert frame["db"] == db and frame["error"] is None
        assert [(t["id"], t["label"]) for t in frame["trees"]] == [
            (str(root.session_id), "served-root")
        ]
        assert server.get(f"/anything-else?token={TOKEN}")[0] == 404
        assert server.get("/anything-else")[0] == 401  # what exists is not told either
    finally:
        server.stop()


def test_clients_that_reset_their_connection_leave_no_traceback(
    tmp_path: Path, backend: Backend
) -> None:
    """A client that resets its connection mid-answer (a closed tab, a timed-out
    request) is the client's business: the server goes on serving, and prints no
    traceback for it (it printed one per client)."""
    import socket
    import struct

    db = str(tmp_path / "s.db")
    with Runtime(db, backend=backend) as rt:
        for i in range(200):
            rt.spawn("echo", label=f"root{i}" + "x" * 200)
    server = _Server(db, "--interval", "0.05")
    try:
        host, port = server.url.split("//")[1].strip("/").split(":")
        for path in ("/tree.json", "/", "/tree.json"):
            for _ in range(4):
                sock = socket.create_connection((host, int(port)))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                sock.recv(10)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()  # a reset, with most of the answer unread
        status, body = server.get("/tree.json")
        assert status == 200 and len(json.loads(body)["trees"]) == 200
    finally:
        server.stop()
    assert "Traceback" not in server.stderr


def test_the_event_stream_sends_a_frame_when_the_trees_change(
    tmp_path: Path, backend: Backend
) -> None:
    """``/events`` sends the current frame at once and a new one when the store
    changes (and only then: frames are numbered by change)."""
    db = str(tmp_path / "s.db")
    with Runtime(db, backend=backend) as rt:
        rt.spawn("echo", label="first")
        rt.sessions.flush()
        server = _Server(db, "--interval", "0.05")
        try:
            with urllib.request.urlopen(server.url + "events", timeout=30) as stream:
                assert stream.headers["Content-Type"] == "text/event-stream"

                def event() -> tuple[int, Any]:
                    fields = {}
                    while (line := stream.readline().decode().rstrip("\n")) != "":
                        if not line.startswith(":"):
                            name, _, value = line.partition(": ")
                            fields[name] = value
                    return int(fields["id"]), json.loads(fields["data"])

                first_id, first = event()
                assert [t["label"] for t in first["trees"]] == ["first"]
                rt.spawn("echo", label="second")
                rt.sessions.flush()
                second_id, second = event()
                assert second_id == first_id + 1
                assert sorted(t["label"] for t in second["trees"]) == ["first", "second"]
        finally:
            server.stop()


def test_a_root_not_in_the_store_is_served_as_one_error(tmp_path: Path, backend: Backend) -> None:
    """A well-formed ROOT the store does not hold (yet): the frame says so once,
    ``[CODE] message`` like every other error line, and lists no tree."""
    db = str(tmp_path / "s.db")
    with Runtime(db, backend=backend) as rt:
        rt.spawn("echo", label="other")
    server = _Server(db, "ab" * 16, "--interval", "0.05")
    try:
        status, body = server.get("/tree.json")
        frame = json.loads(body)
        assert status == 200 and frame["trees"] == []
        assert frame["error"].startswith("[SESSION_NOT_FOUND] "), frame["error"]
        assert frame["error"].count("SESSION_NOT_FOUND") == 1
    finally:
        server.stop()


@pytest.mark.parametrize(
    "args",
    [
        ["--interval", "0"],
        ["--interval", "inf"],
        ["--port", "70000"],
        ["--token", ""],
        ["--token", " spaced "],  # the server strips what it is sent: nobody could get in
        ["--token", "clé"],  # an HTTP header cannot carry it
        ["nothex"],  # a ROOT that is no session id, refused as `tree` refuses it
    ],
)
def test_bad_serve_arguments(
    tmp_path: Path, backend: Backend, args: list[str], capsys: Any
) -> None:
    """Bad intervals, ports, tokens or roots: one line, exit 2, nothing served."""
    db = str(tmp_path / "s.db")
    with Runtime(db, backend=backend):
        pass
    assert main(["serve", db, *args]) == 2
    assert "INVALID_ARGUMENT" in capsys.readouterr().err


def test_serve_needs_an_existing_database(tmp_path: Path, capsys: Any) -> None:
    """A missing file is ``NOT_A_DATABASE``, as for ``tree``."""
    assert main(["serve", str(tmp_path / "missing.db")]) == 2
    assert "NOT_A_DATABASE" in capsys.readouterr().err


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless Chromium from the system packages, driven by Selenium."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        if os.environ.get("SUBAGENTS_REQUIRE_BROWSER"):
            pytest.fail("SUBAGENTS_REQUIRE_BROWSER is set but chromium/chromedriver are missing")
        pytest.skip("no chromium and chromedriver (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1200,700")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_page_shows_a_child_appear_and_change_state(
    tmp_path: Path, backend: Backend, browser: Any, blocked_child: tuple[Gate, Any]
) -> None:
    """Issue 18 point 4: in a real browser, the page shows a continuable child appear
    under its parent while its turn runs (``running``, its message in the inbox),
    and then settle -- redrawn from the event stream, no reload."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    gate, child = blocked_child
    db = str(tmp_path / "live.db")
    with Runtime(db, backend=backend) as rt:
        rt.models.register("child", lambda _o: child)
        root = rt.spawn("echo", label="root")
        rt.sessions.flush()
        server = _Server(db, "--token", TOKEN, "--interval", "0.05")
        try:
            browser.get(f"{server.url}?token={TOKEN}")
            # A frame redraws the trees: an element found may be replaced at once.
            wait = WebDriverWait(browser, 60, ignored_exceptions=[StaleElementReferenceException])

            def state_of(sid: Any) -> Any:
                def check(driver: Any) -> str | None:
                    found = driver.find_elements(By.CSS_SELECTOR, f'li.session[data-id="{sid}"]')
                    state: str | None = found[0].get_attribute("data-state") if found else None
                    return state

                return check

            assert wait.until(state_of(root.session_id)) in ("settled", "waiting")
            assert browser.find_element(By.ID, "status").text == "live"
            handle = rt.subagents.start_continuable(
                ContinuableStartSpec(
                    parent=root, provider="local", prompt="go", label="late-child", model="child"
                )
            )
            assert gate.wait_reached(30)
            rt.sessions.flush()
            wait.until(lambda d: state_of(handle.child_id)(d) == "running")
            # Under its parent, labelled: one query, as frames may redraw the page.
            nested = (
                f'li.session[data-id="{root.session_id}"] li.session[data-id="{handle.child_id}"]'
            )
            wait.until(lambda d: "late-child" in d.find_element(By.CSS_SELECTOR, nested).text)
            browser.save_screenshot(str(tmp_path / "running.png"))
            gate.release()
            assert rt.wait_idle(30)
            rt.sessions.flush()
            wait.until(lambda d: state_of(handle.child_id)(d) == "settled")
        finally:
            server.stop()


def test_serve_stops_cleanly_on_sigterm(tmp_path: Path, backend: Backend) -> None:
    """``SIGTERM`` (a service manager stopping it) ends ``serve`` as Ctrl-C does:
    its store closed, one line, the status of a terminated process (143). It died
    of the signal, closing nothing."""
    import signal

    db = str(tmp_path / "s.db")
    with Runtime(db, backend=backend) as rt:
        rt.spawn("echo", label="root")
    server = _Server(db, "--interval", "0.05")
    assert server.get("/tree.json")[0] == 200
    server.proc.send_signal(signal.SIGTERM)
    _out, err = server.proc.communicate(timeout=30)
    assert server.proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == "terminated" and "Traceback" not in err


def test_a_sigterm_while_a_request_starts_ends_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM's exception raised in the server's loop as it hands a request to its
    thread (where the signal handler runs) ends the loop: it is not the request's
    failure, which the loop logs and serves on past."""
    from subagents.actors._shell._cli import _terminate
    from subagents.actors._shell._serve import TreeFeed, TreeServer
    from subagents.store import MemoryStore

    store = MemoryStore()
    feed = TreeFeed(store, "mem", None, 60.0)
    server = TreeServer(feed, "127.0.0.1", 0, None)
    try:

        def started(request: Any, client_address: Any) -> None:
            _terminate(signal.SIGTERM, None)  # the handler, at this very point

        monkeypatch.setattr(server, "process_request", started)
        address = server.server_address[:2]
        with socket.create_connection(address, timeout=10), pytest.raises(BaseException) as caught:
            server._handle_request_noblock()
        assert type(caught.value).__name__ == "_Terminated"
    finally:
        server.server_close()
        feed.close()
        store.close()
