"""A gevent.pywsgi JSON server embedding a subagents runtime on the native gevent backend.

Run::

    python examples/gevent_server.py --db server.db --port 8080 [--token SECRET]
    python examples/gevent_server.py --db postgresql://user@host/db --port 8080

It binds 127.0.0.1 unless told otherwise (``--host``). With ``--token`` every
request must carry ``Authorization: Bearer SECRET`` (else 401). A client is named
by its ``X-Client-Id`` header (default ``default``) and may address only the
agents its own requests created (others answer 404, as if absent).

Endpoints (JSON in, JSON out; errors are ``{"error": {"code", "message"}}`` with a
4xx status, never a 500 for a bad request):

=======  ==========================================  ===================================
method   path                                        does
=======  ==========================================  ===================================
POST     /agents                                     create a top-level agent ``{label}``
GET      /agents                                     this client's top-level agents
POST     /agents/{id}/messages                       ``{content}`` to the agent itself
                                                     -> ``{message_id}``
POST     /agents/{id}/children                       start a continuable child
                                                     ``{prompt, label, model?}``
POST     /agents/{id}/children/{child}/followup      ``{content}`` -> ``{message_id}``
POST     /agents/{id}/children/{child}/interrupt     interrupt the child's current turn
POST     /agents/{id}/children/{child}/report        the child reports ``{content, delivery}``
GET      /agents/{id}/children                       ``list_children``
GET      /agents/{id}/descendants                    ``list_descendants``
GET      /sessions/{id}                              the session's events
GET      /events?limit=N                             streams ``subagent/start|end`` as JSON lines
=======  ==========================================  ===================================

No monkey-patching: pywsgi serves on gevent's own sockets, and the runtime's
actors are greenlets of the same hub.

Restarts lose nothing: sessions live in the store, top-level agents record their
model (a request resumes one that is not live), and which client created which
session is kept beside the store (``DB.owners``, a small SQLite table; on
PostgreSQL an ``owners`` table in the store's schema), so a restarted
server -- or a second worker on the same files -- serves every session it
created.

Scaling out: several server processes on one PostgreSQL store (or one SQLite
file on one host) serve one tree, with no balancer in front. A follow-up that
reaches a worker where the child's parent is not live is committed to the
child's durable inbox and run where the tree lives (the parent's holder is woken
by ``NOTIFY``), once, whichever worker the client asked.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import gevent
import gevent.event
import gevent.queue
from gevent.pywsgi import WSGIServer
from subagents.actors import ContinuableStartSpec, Runtime, SubagentEvent, UserAuthority
from subagents.protocol import ErrorCode, SessionId, SubagentError, event_to_wire

Start = Callable[[str, list[tuple[str, str]]], Any]

_STATUS = {
    ErrorCode.UNAUTHORIZED: 403,
    ErrorCode.SESSION_NOT_FOUND: 404,
    ErrorCode.PROVIDER_NOT_FOUND: 404,
    ErrorCode.MODEL_NOT_FOUND: 404,
    ErrorCode.ADMISSION_CLOSED: 409,
    ErrorCode.LEASE_HELD: 409,
    ErrorCode.AGENT_DISPOSED: 409,
    ErrorCode.CANCELLED: 409,
    ErrorCode.TIMEOUT: 504,
}


class HttpError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)


def worker(turn: Any) -> Any:
    """The default child model: acknowledges each message."""
    return f"{turn.agent.label} handled {turn.content!r}"


class Owners:
    """Which client created which session, kept in SQLite beside the session store
    (``None``: in memory, for a memory runtime), or -- given a connection -- in a
    table of a PostgreSQL store's schema (``PostgresStore.connect()``)."""

    def __init__(self, path: str | None, *, connection: Any = None) -> None:
        self._db: Any = connection
        # psycopg spells its placeholders %s, sqlite3 ?.
        self._mark = "%s" if connection is not None else "?"
        if connection is None:
            self._db = sqlite3.connect(path or ":memory:", isolation_level=None, timeout=30)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS owners"
            " (session_id TEXT PRIMARY KEY, client TEXT NOT NULL, root INTEGER NOT NULL)"
        )
        self._lock = threading.Lock()

    def _sql(self, sql: str) -> str:
        return sql.replace("?", self._mark)

    def add(self, session_id: str, client: str, *, root: bool) -> None:
        with self._lock:
            self._db.execute(
                self._sql("INSERT INTO owners VALUES (?, ?, ?) ON CONFLICT DO NOTHING"),
                (session_id, client, int(root)),
            )

    def get(self, session_id: str) -> str | None:
        with self._lock:
            row = self._db.execute(
                self._sql("SELECT client FROM owners WHERE session_id = ?"),
                (session_id,),
            ).fetchone()
        return None if row is None else str(row[0])

    def roots(self, client: str) -> set[str]:
        with self._lock:
            rows = self._db.execute(
                self._sql("SELECT session_id FROM owners WHERE client = ? AND root = 1"),
                (client,),
            ).fetchall()
        return {r[0] for r in rows}

    def close(self) -> None:
        with self._lock:
            self._db.close()


class App:
    """The WSGI application: routes, auth, ownership, error mapping."""

    def __init__(
        self, runtime: Runtime, token: str | None = None, owners: Owners | None = None
    ) -> None:
        self.rt = runtime
        self.token = token
        self.owners = owners if owners is not None else Owners(None)
        runtime.models.register("worker", lambda _options: worker, replace=True)
        self.routes: list[tuple[str, re.Pattern[str], Callable[..., Any]]] = [
            ("POST", re.compile(r"^/agents$"), self.create_agent),
            ("GET", re.compile(r"^/agents$"), self.list_agents),
            ("POST", re.compile(r"^/agents/(\w+)/messages$"), self.message),
            ("POST", re.compile(r"^/agents/(\w+)/children$"), self.start_child),
            ("POST", re.compile(r"^/agents/(\w+)/children/(\w+)/followup$"), self.followup),
            ("POST", re.compile(r"^/agents/(\w+)/children/(\w+)/interrupt$"), self.interrupt),
            ("POST", re.compile(r"^/agents/(\w+)/children/(\w+)/report$"), self.report),
            ("GET", re.compile(r"^/agents/(\w+)/children$"), self.children),
            ("GET", re.compile(r"^/agents/(\w+)/descendants$"), self.descendants),
            ("GET", re.compile(r"^/sessions/(\w+)$"), self.session),
        ]

    # -- plumbing ------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: Start) -> Iterable[bytes]:
        try:
            self._authenticate(environ)
            client = environ.get("HTTP_X_CLIENT_ID", "default")
            method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
            if method == "GET" and path == "/events":
                return self.events(environ, start_response, client)
            for verb, pattern, handler in self.routes:
                match = pattern.match(path)
                if match and verb == method:
                    body = self._body(environ) if method == "POST" else {}
                    result = handler(client, body, *match.groups())
                    return self._respond(start_response, 200, result)
            raise HttpError(404, "NOT_FOUND", f"no route {method} {path}")
        except HttpError as exc:
            return self._respond(start_response, exc.status, _error(exc.code, str(exc)))
        except SubagentError as exc:
            status = _STATUS.get(exc.code, 400)
            return self._respond(start_response, status, _error(exc.code, str(exc)))

    def _authenticate(self, environ: dict[str, Any]) -> None:
        if self.token is None:
            return
        if environ.get("HTTP_AUTHORIZATION", "") != f"Bearer {self.token}":
            raise HttpError(401, "UNAUTHENTICATED", "a bearer token is required")

    @staticmethod
    def _body(environ: dict[str, Any]) -> dict[str, Any]:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise HttpError(400, ErrorCode.INVALID_ARGUMENT, "bad Content-Length") from None
        if length > 1_000_000:
            raise HttpError(413, ErrorCode.INVALID_ARGUMENT, "body too large")
        raw = environ["wsgi.input"].read(length) if length else b""
        try:
            data = json.loads(raw or b"{}")
        except (ValueError, UnicodeDecodeError):
            raise HttpError(400, ErrorCode.INVALID_ARGUMENT, "the body is not JSON") from None
        if not isinstance(data, dict):
            raise HttpError(400, ErrorCode.INVALID_ARGUMENT, "the body must be a JSON object")
        return data

    @staticmethod
    def _respond(start_response: Start, status: int, payload: Any) -> list[bytes]:
        body = json.dumps(_jsonable(payload)).encode()
        reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden"}.get(
            status, "Error"
        )
        start_response(
            f"{status} {reason}",
            [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
        )
        return [body]

    def _owned(self, client: str, session_id: str) -> str:
        if self.owners.get(session_id) != client:
            raise HttpError(404, ErrorCode.SESSION_NOT_FOUND, f"no session {session_id}")
        return session_id

    def _agent(self, client: str, agent_id: str) -> Any:
        """The live top-level agent, resumed here when it is not (after a restart)."""
        self._owned(client, agent_id)
        agent = self.rt.agents.get(agent_id)
        if agent is None:
            try:
                agent = self.rt.agents.resume(agent_id)
            except SubagentError as exc:
                agent = self.rt.agents.get(agent_id)  # resumed by a concurrent request
                if exc.code != ErrorCode.SESSION_EXISTS or agent is None:
                    raise
        return agent

    # -- handlers ----------------------------------------------------------------------

    def create_agent(self, client: str, body: dict[str, Any]) -> Any:
        label = body.get("label", "agent")
        agent = self.rt.spawn("echo", label=label if isinstance(label, str) else None)
        self.owners.add(agent.session_id, client, root=True)
        return {"session_id": agent.session_id}

    def list_agents(self, client: str, body: dict[str, Any]) -> Any:
        mine = self.owners.roots(client)
        return {
            "agents": [
                {"session_id": h.id, "label": h.label, "created_at": h.created_at}
                for h in self.rt.agents.roots()
                if h.id in mine
            ]
        }

    def message(self, client: str, body: dict[str, Any], agent_id: str) -> Any:
        self._owned(client, agent_id)
        if "content" not in body:
            raise HttpError(400, ErrorCode.INVALID_ARGUMENT, "content is required")
        return {"message_id": self.rt.agents.send(agent_id, body["content"])}

    def start_child(self, client: str, body: dict[str, Any], agent_id: str) -> Any:
        agent = self._agent(client, agent_id)
        spec = ContinuableStartSpec(
            parent=agent,
            provider="local",
            prompt=body.get("prompt", ""),
            label=body.get("label", "child"),
            model=body.get("model", "worker"),
        )
        child_id, message_id = self.rt.subagents.start_continuable(spec)
        self.owners.add(child_id, client, root=False)
        return {"child_id": child_id, "message_id": message_id}

    def followup(self, client: str, body: dict[str, Any], agent_id: str, child_id: str) -> Any:
        self._owned(client, agent_id)
        self._owned(client, child_id)
        if "content" not in body:
            raise HttpError(400, ErrorCode.INVALID_ARGUMENT, "content is required")
        message_id = body.get("message_id")
        if message_id is not None and not isinstance(message_id, str):
            raise HttpError(400, ErrorCode.INVALID_ARGUMENT, "message_id must be a string")
        # By the parent's id: wherever the tree is live (here, or another worker).
        message_id = self.rt.subagents.followup(
            agent_id, child_id, body["content"], message_id=message_id
        )
        return {"message_id": message_id}

    def interrupt(self, client: str, body: dict[str, Any], agent_id: str, child_id: str) -> Any:
        self._agent(client, agent_id)
        self._owned(client, child_id)
        self.rt.subagents.interrupt(child_id, UserAuthority(agent_id))
        return {"interrupted": child_id}

    def report(self, client: str, body: dict[str, Any], agent_id: str, child_id: str) -> Any:
        self._agent(client, agent_id)
        self._owned(client, child_id)
        child = self.rt.agents.get(child_id)
        if child is None:
            raise HttpError(409, ErrorCode.UNAUTHORIZED, "the child is not resident")
        message_id = self.rt.subagents.report_from(
            child, body.get("content", ""), delivery=body.get("delivery", "quiet")
        )
        return {"message_id": message_id}

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

    def session(self, client: str, body: dict[str, Any], session_id: str) -> Any:
        self._owned(client, session_id)
        self.rt.sessions.flush()
        records = self.rt.sessions.read(SessionId(session_id))
        return {"events": [{"seq": r.seq, **event_to_wire(r.event)} for r in records]}

    def events(
        self, environ: dict[str, Any], start_response: Start, client: str
    ) -> Iterator[bytes]:
        """Stream this client's ``subagent/start|end`` events as JSON lines."""
        query = dict(
            p.split("=", 1) for p in environ.get("QUERY_STRING", "").split("&") if "=" in p
        )
        try:
            limit = int(query.get("limit", "0")) or None
        except ValueError:
            raise HttpError(400, ErrorCode.INVALID_ARGUMENT, "limit must be an int") from None
        queue: gevent.queue.Queue[SubagentEvent] = gevent.queue.Queue()

        def listen(event: SubagentEvent) -> None:
            mine = (
                event.parent_session is not None and self.owners.get(event.parent_session) == client
            )
            if mine:
                queue.put(event)

        subscription = self.rt.subagents.subscribe(listen)
        start_response("200 OK", [("Content-Type", "application/x-ndjson")])

        def stream() -> Iterator[bytes]:
            sent = 0
            try:
                yield b'{"type": "subscribed"}\n'
                while limit is None or sent < limit:
                    event = queue.get()
                    yield (
                        json.dumps(_jsonable({k: getattr(event, k) for k in event.__slots__}))
                        + "\n"
                    ).encode()
                    sent += 1
            finally:
                subscription.dispose()

        return stream()


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8080, help="port; 0 picks a free one")
    parser.add_argument(
        "--db", default="server.db", help="SQLite session store, or a postgresql:// URL"
    )
    parser.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN'")
    args = parser.parse_args(argv)
    store: Any = args.db
    if args.db.startswith(("postgresql://", "postgres://")):
        from subagents.store import PostgresStore

        store = PostgresStore(args.db)
        owners = Owners(None, connection=store.connect())
    else:
        owners = Owners(f"{args.db}.owners")
    with Runtime(store, backend="gevent") as rt:
        app = App(rt, args.token, owners)
        server = WSGIServer((args.host, args.port), app, log=None, error_log=None)
        stop = gevent.event.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            gevent.signal_handler(signum, stop.set)
        server.start()
        print(f"listening on http://{args.host}:{server.server_port}", flush=True)
        stop.wait()
        server.stop(timeout=5)
    owners.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
