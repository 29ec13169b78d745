"""A gevent.pywsgi JSON server embedding a subagents runtime on the native gevent backend.

Run::

    python examples/gevent_server.py --db server.db --port 8080 [--token SECRET]
    python examples/gevent_server.py --db postgresql://user@host/db --port 8080

It binds 127.0.0.1 unless told otherwise (``--host``). With ``--token`` every
request must carry ``Authorization: Bearer SECRET`` (else 401, saying whether the
header is missing, malformed or holds a wrong token). A client is named by its
``X-Client-Id`` header (default ``default``) and may address only the agents its
own requests created (others answer 404, as if absent).

Endpoints (JSON in, JSON out; errors are ``{"error": {"code", "message"}}``: a
4xx status for a bad request, never a 500; a 5xx for the server's own failure --
503 with ``Retry-After`` while the store cannot be reached or the server stops,
500 ``INTERNAL`` for a bug, its traceback logged once; ``gevent_server_errors.py``):

=======  ==========================================  ===================================
method   path                                        does
=======  ==========================================  ===================================
POST     /agents                                     create a top-level agent ``{label,
                                                     session_id?}`` (a retry's id: once)
GET      /agents                                     this client's top-level agents
                                                     (``diagnostics``: those that do not decode)
POST     /agents/{id}/messages                       ``{content, message_id?}`` to the agent
                                                     itself -> ``{message_id}``
POST     /agents/{id}/children                       start a continuable child
                                                     ``{prompt, label, model?, message_id?}``
POST     /agents/{id}/children/{child}/followup      ``{content, message_id?}`` -> ``{message_id}``
POST     /agents/{id}/children/{child}/interrupt     interrupt the child's current turn
POST     /agents/{id}/children/{child}/report        the child reports ``{content, delivery?,
                                                     message_id?}`` -> ``{message_id}``
GET      /agents/{id}/children/{child}/reports/{m}   the report's receipt (``status``, ``turn``)
GET      /agents/{id}/children                       ``list_children``
GET      /agents/{id}/descendants                    ``list_descendants``
GET      /sessions/{id}?from_seq=S&limit=N           a page of the session's events that
                                                     decode, from seq ``S`` (default 0),
                                                     ``N`` at most (default 1000, at most
                                                     10000; fewer past 4 MB of JSON);
                                                     ``diagnostics``: the seqs that do not;
                                                     ``next``: the next page's ``from_seq``
                                                     (``null``: nothing more yet)
GET      /events?limit=N                             streams ``subagent/start|end`` as JSON lines
                                                     (a ``heartbeat`` line when quiet): of the
                                                     children this process runs (see Scaling out)
GET      /stats                                      live agents, idle disposals, open streams
=======  ==========================================  ===================================

Bodies are read by ``Content-Length`` or chunked (at most 1 MB, else 413) and
parsed as strict JSON: ``NaN``, ``Infinity`` and ``1e400`` are refused (400), as
is a body cut short. Responses are standard JSON, and connections keep alive
without Nagle's delay (``TCP_NODELAY``), at most 1000 at once (more wait in
the listen backlog). SIGTERM (or Ctrl-C) stops gracefully: new connections are
refused (the server prints ``stopped listening on ...`` once they are), idle
kept-alive ones closed, and the requests in flight answered (for 5 s at most; a
new one on a kept-alive connection, or one the listen backlog held, is a 503
``SHUTTING_DOWN``) before the runtime closes. One
still running after those 5 s is cut short with a 503 ``SHUTTING_DOWN`` saying
its outcome is unknown (a follow-up may yet be committed): send it again, with
the same ``message_id``, and it is accepted once.
Those HTTP details live in ``gevent_server_http.py``; the ownership table, idle
disposal and event streams in ``gevent_server_state.py``.

No monkey-patching is needed: pywsgi serves on gevent's own sockets, and the
runtime's actors are greenlets of the same hub. A process that patches anyway
(``gevent.monkey.patch_all()`` first, as gunicorn's ``-k gevent`` worker does)
runs it unchanged: the locks the threads of gevent's pool share stay the OS's
own (``gevent_server_state.native_lock``; a patched ``threading.Lock`` hung them).

Idle agents are disposed: a top-level agent no request is using, idle (no turn
running or queued) for ``--idle-timeout`` seconds (default 30), leaves memory,
and so do the least recently used idle ones while more than ``--max-live``
(default 1000) are live. Nothing is lost: its session is in the store, and the
next request for it resumes it (from the model it recorded). A continuable child
settles on its own as soon as it is idle. A report from a child reaches its
parent whether either is live (``report_from`` by the child's id: a parent that
is not live keeps it in its durable inbox; a waking report activates it).

Restarts lose nothing: sessions live in the store, top-level agents record their
model (a request resumes one that is not live), and which client created which
session is kept beside the store (``DB.owners``, a small SQLite table; on
PostgreSQL an ``owners`` table in the store's schema), so a restarted
server -- or a second worker on the same files -- serves every session it
created.

Scaling out: several server processes on one PostgreSQL store (or one SQLite
file on one host) serve one tree, with no balancer in front. A follow-up or a
child's start that reaches a worker where the parent is not live is committed
there (the message to the child's durable inbox; a new child with its prompt)
and run where the tree lives (the parent's holder is woken by ``NOTIFY``), once,
whichever worker the client asked; an interrupt is asked of the worker that
runs the child. A worker's ``/events`` stream carries the ``subagent/start|end``
of the children it runs -- those of the trees it holds -- so a child started
through one worker is announced by the worker its tree lives in: a client of
several workers follows each one's stream, or reads ``/agents/{id}/descendants``
(from any worker: the store's).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import gevent
import gevent.event
from gevent_server_errors import MAX_PAGE, PAGE, answer_failure, read_session, readable_roots
from gevent_server_http import (
    HttpError,
    NoDelayServer,
    Start,
    check_bearer,
    int_param,
    query,
    read_json,
    respond,
)
from gevent_server_state import EventStreams, IdleAgents, Owners
from subagents.actors import ContinuableStartSpec, Runtime, UserAuthority
from subagents.protocol import ErrorCode, SessionId, SubagentError
from subagents.store import is_postgres_url

#: Seconds a SIGTERM (or Ctrl-C) waits for the requests in flight before the runtime closes.
DRAIN_TIMEOUT = 5.0


def worker(turn: Any) -> Any:
    """The default child model: acknowledges each message. ``{"work": seconds}``
    (at most 60) works that long first -- until interrupted, if it is."""
    content = turn.content
    work = content.get("work") if isinstance(content, dict) else None
    if isinstance(work, (int, float)) and turn.signal.wait(min(max(float(work), 0.0), 60.0)):
        return f"{turn.agent.label} was interrupted"
    return f"{turn.agent.label} handled {content!r}"


class App:
    """The WSGI application: routes, auth, ownership, error mapping."""

    def __init__(
        self,
        runtime: Runtime,
        token: str | None = None,
        owners: Owners | None = None,
        *,
        idle_timeout: float = 30.0,
        max_live: int = 1000,
        heartbeat: float = 15.0,
    ) -> None:
        self.rt = runtime
        self.token = token
        self.owners = owners if owners is not None else Owners(None)
        self.streams = EventStreams(runtime, self.owners, heartbeat=heartbeat)
        self.idle = IdleAgents(runtime, idle_timeout=idle_timeout, max_live=max_live)
        runtime.models.register("worker", lambda _options: worker, replace=True)
        child = r"^/agents/(\w+)/children/(\w+)"
        self.routes: list[tuple[str, re.Pattern[str], Callable[..., Any]]] = [
            ("POST", re.compile(r"^/agents$"), self.create_agent),
            ("GET", re.compile(r"^/agents$"), self.list_agents),
            ("POST", re.compile(r"^/agents/(\w+)/messages$"), self.message),
            ("POST", re.compile(r"^/agents/(\w+)/children$"), self.start_child),
            ("POST", re.compile(child + r"/followup$"), self.followup),
            ("POST", re.compile(child + r"/interrupt$"), self.interrupt),
            ("POST", re.compile(child + r"/report$"), self.report),
            ("GET", re.compile(child + r"/reports/(\w+)$"), self.receipt),
            ("GET", re.compile(r"^/agents/(\w+)/children$"), self.children),
            ("GET", re.compile(r"^/agents/(\w+)/descendants$"), self.descendants),
            ("GET", re.compile(r"^/sessions/(\w+)$"), self.session),
            ("GET", re.compile(r"^/stats$"), self.stats),
        ]

    # -- plumbing ------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: Start) -> Iterable[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        try:
            if self.token is not None:
                check_bearer(environ, self.token)
            client = environ.get("HTTP_X_CLIENT_ID", "default")
            if method == "GET" and path == "/events":
                return self.events(environ, start_response, client)
            for verb, pattern, handler in self.routes:
                match = pattern.match(path)
                if match and verb == method:
                    # A POST's JSON body; a GET's query parameters.
                    body = read_json(environ) if method == "POST" else query(environ)
                    result = handler(client, body, *match.groups())
                    return respond(start_response, 200, result)
            raise HttpError(404, "NOT_FOUND", f"no route {method} {path}")
        except Exception as exc:  # typed, a 4xx or 5xx; anything else: 500 INTERNAL, logged
            return answer_failure(start_response, exc, f"{method} {path}")

    def _owned(self, client: str, session_id: str) -> str:
        if self.owners.get(session_id) != client:
            raise HttpError(404, ErrorCode.SESSION_NOT_FOUND, f"no session {session_id}")
        return session_id

    def _child(self, client: str, agent_id: str, child_id: str) -> None:
        """``child_id`` is this client's, and a child of ``agent_id``."""
        self._owned(client, agent_id)
        self._owned(client, child_id)
        header = self.rt.sessions.header(SessionId(child_id))
        if header is None or header.parent_session != agent_id:
            raise HttpError(404, ErrorCode.SESSION_NOT_FOUND, f"no child {child_id} of {agent_id}")

    @staticmethod
    def _content(body: dict[str, Any]) -> Any:
        if "content" not in body:
            raise HttpError(400, ErrorCode.INVALID_ARGUMENT, "content is required")
        return body["content"]

    @staticmethod
    def _message_id(body: dict[str, Any]) -> str | None:
        message_id = body.get("message_id")
        if message_id is not None and not isinstance(message_id, str):
            raise HttpError(400, ErrorCode.INVALID_ARGUMENT, "message_id must be a string")
        return message_id

    # -- handlers ----------------------------------------------------------------------

    def create_agent(self, client: str, body: dict[str, Any]) -> Any:
        """A ``session_id`` of the client's (32 fresh hex digits) makes a retry create
        nothing: the same id answers the agent made before (409: another's)."""
        label, sid = body.get("label", "agent"), body.get("session_id")
        if sid is not None and not isinstance(sid, str):
            raise HttpError(400, ErrorCode.INVALID_ARGUMENT, "session_id must be a string")
        try:
            agent = self.rt.spawn(
                "echo", label=label if isinstance(label, str) else None, session_id=sid
            )
        except SubagentError as exc:
            if exc.code != ErrorCode.SESSION_EXISTS:
                raise
            # The answer was lost -- or this server, between the spawn and the row.
            header = self.rt.sessions.header(SessionId(sid))
            if header is not None and header.parent_session is None:
                self.owners.add(sid, client, root=True)  # (the first row stays)
            if self.owners.get(sid) != client:
                raise HttpError(409, ErrorCode.SESSION_EXISTS, f"{sid} is taken") from None
            return {"session_id": sid}
        self.owners.add(agent.session_id, client, root=True)
        self.idle.touch(agent.session_id)
        return {"session_id": agent.session_id}

    def list_agents(self, client: str, body: dict[str, Any]) -> Any:
        """A root whose header does not decode is a diagnostic; the others are listed."""
        found, diagnostics = readable_roots(self.rt, self.owners.roots(client))
        return {
            "agents": [
                {"session_id": h.id, "label": h.label, "created_at": h.created_at} for h in found
            ],
            "diagnostics": diagnostics,
        }

    def message(self, client: str, body: dict[str, Any], agent_id: str) -> Any:
        self._owned(client, agent_id)
        content = self._content(body)
        with self.idle.using(agent_id):  # sent wherever it lives; resumed here if nowhere
            message_id = self.rt.agents.send(agent_id, content, message_id=self._message_id(body))
        return {"message_id": message_id}

    def start_child(self, client: str, body: dict[str, Any], agent_id: str) -> Any:
        """By the parent's id: started wherever the tree is live (here, or the worker
        that holds it; resumed here if nowhere)."""
        self._owned(client, agent_id)
        spec = ContinuableStartSpec(
            parent=SessionId(agent_id),
            provider="local",
            prompt=body.get("prompt", ""),
            label=body.get("label", "child"),
            model=body.get("model", "worker"),
            message_id=self._message_id(body),
        )
        with self.idle.using(agent_id):
            child_id, message_id = self.rt.subagents.start_continuable(spec)
        self.owners.add(child_id, client, root=False)
        return {"child_id": child_id, "message_id": message_id}

    def followup(self, client: str, body: dict[str, Any], agent_id: str, child_id: str) -> Any:
        self._owned(client, agent_id)
        self._owned(client, child_id)
        content, message_id = self._content(body), self._message_id(body)
        # By the parent's id: wherever the tree is live (here, or another worker).
        with self.idle.using(agent_id):
            message_id = self.rt.subagents.followup(
                agent_id, child_id, content, message_id=message_id
            )
        return {"message_id": message_id}

    def interrupt(self, client: str, body: dict[str, Any], agent_id: str, child_id: str) -> Any:
        """By the parent's address: the child's running turn is cut wherever the tree
        is live (here, or the worker that holds it)."""
        self._child(client, agent_id, child_id)
        self.rt.subagents.interrupt(child_id, UserAuthority(agent_id))
        return {"interrupted": child_id}

    def report(self, client: str, body: dict[str, Any], agent_id: str, child_id: str) -> Any:
        """By the child's id: resident or settled, to a parent live or not (a parent
        that is not live keeps it, and a waking report activates it)."""
        self._child(client, agent_id, child_id)
        content, message_id = self._content(body), self._message_id(body)
        with self.idle.using(agent_id):
            message_id = self.rt.subagents.report_from(
                child_id, content, delivery=body.get("delivery", "quiet"), message_id=message_id
            )
        return {"message_id": message_id}

    def receipt(
        self, client: str, body: dict[str, Any], agent_id: str, child_id: str, message_id: str
    ) -> Any:
        self._child(client, agent_id, child_id)
        receipt = self.rt.subagents.report_receipt(child_id, message_id)
        return {"message_id": message_id, "status": receipt.status, "turn": receipt.turn}

    def _rows(self, listing: Any) -> Any:
        return {
            "rows": [{k: getattr(r, k) for k in r.__slots__} for r in listing.rows],
            "diagnostics": [
                {"id": d.id, "kind": d.kind, "detail": d.detail} for d in listing.diagnostics
            ],
        }

    def children(self, client: str, body: dict[str, Any], agent_id: str) -> Any:
        self._owned(client, agent_id)
        return self._rows(self.rt.subagents.list_children(agent_id))

    def descendants(self, client: str, body: dict[str, Any], agent_id: str) -> Any:
        self._owned(client, agent_id)
        return self._rows(self.rt.subagents.list_descendants(agent_id))

    def session(self, client: str, params: dict[str, str], session_id: str) -> Any:
        """A page of the session: the events from ``from_seq`` that decode (each that
        does not is a diagnostic), at most ``limit``, and the ``next`` page's seq."""
        self._owned(client, session_id)
        from_seq = int_param(params, "from_seq", 0, 0, None)
        limit = int_param(params, "limit", PAGE, 1, MAX_PAGE)
        return read_session(self.rt, session_id, from_seq, limit)

    def stats(self, client: str, body: dict[str, Any]) -> Any:
        """This process's residency: what idle disposal keeps in memory."""
        return {
            "live_agents": len(self.idle.live()),
            "live_sessions": len(self.rt.agents.list()),
            "disposed_idle": self.idle.disposed,
            "idle_timeout": self.idle.idle_timeout,
            "max_live": self.idle.max_live,
            "event_streams": len(self.streams),
        }

    def events(
        self, environ: dict[str, Any], start_response: Start, client: str
    ) -> Iterator[bytes]:
        """Stream this client's ``subagent/start|end`` events (see ``EventStreams``)."""
        limit = int_param(query(environ), "limit", 0, 0, None) or None
        start_response("200 OK", [("Content-Type", "application/x-ndjson")])
        return self.streams.open(client, limit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8080, help="port; 0 picks a free one")
    parser.add_argument(
        "--db", default="server.db", help="SQLite session store, or a postgresql:// URL"
    )
    parser.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN'")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=30.0,
        help="dispose a top-level agent idle this many seconds (default: %(default)s)",
    )
    parser.add_argument(
        "--max-live",
        type=int,
        default=1000,
        help="dispose the least recently used idle agents beyond this many (default: %(default)s)",
    )
    parser.add_argument(
        "--heartbeat",
        type=float,
        default=15.0,
        help="an /events stream with nothing to say writes a heartbeat line this often, "
        "so a client gone away is noticed (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    store: Any = args.db
    if is_postgres_url(args.db):
        from subagents.store import PostgresStore

        store = PostgresStore(args.db)
        owners = Owners(None, connect=store.connect)
    else:
        owners = Owners(f"{args.db}.owners")
    with Runtime(store, backend="gevent") as rt:
        app = App(
            rt,
            args.token,
            owners,
            idle_timeout=args.idle_timeout,
            max_live=args.max_live,
            heartbeat=args.heartbeat,
        )
        server = NoDelayServer((args.host, args.port), app, log=None, error_log=None)
        stop = gevent.event.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            gevent.signal_handler(signum, stop.set)
        server.start()
        address = f"http://{args.host}:{server.server_port}"
        print(f"listening on {address}", flush=True)
        stop.wait()
        # New connections are refused (those the backlog held are answered), idle
        # ones closed; the requests in flight are answered (for DRAIN_TIMEOUT at
        # most), and only then does the runtime close.
        app.streams.end()
        server.close()
        with contextlib.suppress(OSError):  # no one reads the output any more
            print(f"stopped listening on {address}", flush=True)
        server.stop(timeout=DRAIN_TIMEOUT)
        app.idle.stop()
    owners.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
