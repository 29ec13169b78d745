"""The ``subagents`` command line: ``demo``, ``tree``, ``show``, ``serve``.

Every command has ``--help``. Errors a user can cause (a missing, empty, damaged
or foreign database; an unknown session) print one line and exit non-zero, never
a traceback. Damaged *records* of a readable database do not stop ``tree`` or
``show``: they print what decodes, a diagnostic per damaged record, and exit 1
(see :data:`EXIT_STATUS`). Output has no colour when it does not go to a
terminal; ``--json`` output is strict JSON (:mod:`._output`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from subagents.protocol import (
    ErrorCode,
    SessionId,
    SubagentError,
)
from subagents.store import is_postgres_url, redacted_url

from ._defaults import DEFAULT_DB

__all__ = ["EXIT_STATUS", "main"]

#: The exit status of ``tree`` and ``show`` (``demo``: 0 or 2).
EXIT_STATUS = """\
exit status: 0 everything printed decoded; 1 printed, but some records are
damaged (a diagnostic names each: [corrupt] ID: why); 2 nothing printed, one line
on stderr: subagents COMMAND: [CODE] message (NOT_A_DATABASE: no subagents
database; DATABASE_CORRUPT: an SQLite file SQLite finds damaged; SESSION_NOT_FOUND,
INVALID_ARGUMENT, PERSISTENCE_UNAVAILABLE...).
--json prints strict JSON: a float that is not finite is the string "NaN",
"Infinity" or "-Infinity", bytes are hex, times ISO 8601."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="subagents", description="Durable agent trees on pykka actors."
    )
    parser.add_argument("--version", action=_Version, help="show the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="build (or, the second time, resume) a demo agent tree",
        description=(
            "Build an agent tree on the embedded SQLite store: continuable and one-shot children, "
            "follow-ups, quiet and waking reports, an interrupt and a drain. "
            "Run it again to resume the persisted tree."
        ),
    )
    demo.add_argument(
        "--db",
        default=DEFAULT_DB,
        help="database file, or a postgresql:// URL (default: %(default)s)",
    )
    demo.add_argument(
        "--backend",
        choices=("threading", "gevent"),
        default="threading",
        help="actor runtime (default: %(default)s)",
    )
    demo.add_argument(
        "--model",
        metavar="NAME",
        help="let a model drive the tree through an OpenAI-compatible API (base URL and key "
        "from OPENAI_BASE_URL and OPENAI_API_KEY); without it the demo is scripted and offline",
    )
    tree = sub.add_parser(
        "tree",
        help="print the durable catalog of a database as a tree",
        description="Print every session tree (or the one under ROOT): label, mode, activity, "
        "diagnostics and active time, from the durable catalog. Sessions no root reaches "
        "(their parent is missing, or parent links loop) are printed as detached trees.",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tree.add_argument("db", help="a subagents database file, or a postgresql:// URL (?schema=...)")
    tree.add_argument("root", nargs="?", help="only the tree under this session id")
    tree.add_argument("--json", action="store_true", help="machine-readable output")
    tree.add_argument(
        "--watch",
        nargs="?",
        const=1.0,
        type=float,
        metavar="SECONDS",
        help="show the trees again every SECONDS (default 1) as they change, until Ctrl-C",
    )
    tree.add_argument("--count", type=int, metavar="N", help="with --watch: stop after N displays")
    serve = sub.add_parser(
        "serve",
        help="serve the trees of a database, live, in a web page on loopback",
        description="Serve a read-only web page that shows every session tree (or the one "
        "under ROOT) as it runs -- state, inbox depth, last turn -- redrawn from a "
        "server-sent-events stream; the store is read once every SECONDS however many pages "
        "are open. Ctrl-C stops it.",
    )
    serve.add_argument("db", help="a subagents database file, or a postgresql:// URL (?schema=...)")
    serve.add_argument("root", nargs="?", help="only the tree under this session id")
    serve.add_argument("--host", default="127.0.0.1", help="the address to bind (default loopback)")
    serve.add_argument("--port", type=int, default=8765, help="the port (0: any free one)")
    serve.add_argument(
        "--token",
        default=None,
        help="require this token: 'Authorization: Bearer TOKEN', or ?token=TOKEN in the page's URL",
    )
    serve.add_argument(
        "--interval", type=float, default=1.0, metavar="SECONDS", help="store reads, every SECONDS"
    )
    serve.add_argument(
        "--max-clients",
        type=int,
        default=64,
        metavar="N",
        help="event streams open at once, at most (default %(default)s); one more is "
        "answered 503 Service Unavailable",
    )
    show = sub.add_parser(
        "show",
        help="print one session's events, decoded",
        description="Print a session's header and events; a record that does not decode is "
        "printed as a diagnostic in its place.",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    show.add_argument("db", help="a subagents database file, or a postgresql:// URL (?schema=...)")
    show.add_argument("session", help="the session id (32 hex digits)")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _open_existing(path: str) -> Any:
    """Open a database that must already exist; SubagentError otherwise."""
    from subagents.store import SqliteStore

    if is_postgres_url(path):
        from subagents.store import PostgresStore

        return PostgresStore(path, create=False, read_only=True)

    if not os.path.exists(path):
        raise SubagentError(f"{path}: no such file", code="NOT_A_DATABASE")
    if os.path.isdir(path):
        raise SubagentError(f"{path}: is a directory", code="NOT_A_DATABASE")
    if os.path.getsize(path) == 0:
        raise SubagentError(f"{path}: empty file, not a subagents database", code="NOT_A_DATABASE")
    # Read-only: never the write lock (a worker's long write does not hold the
    # listing up), never a write (no identity cached by a listing).
    return SqliteStore(path, read_only=True)


def _tree(args: argparse.Namespace, console: Console) -> int:
    from ._tree import run_tree, watch_tree

    if args.watch is not None or args.count is not None:
        if args.json:
            raise SubagentError("--watch shows text: drop --json", code=ErrorCode.INVALID_ARGUMENT)
        interval = 1.0 if args.watch is None else args.watch
        bad_count = args.count is not None and args.count < 1
        if not 0 < interval <= _LONGEST or bad_count:
            raise SubagentError(
                f"--watch takes seconds > 0 (at most {_LONGEST:.0f}) and --count a number >= 1",
                code=ErrorCode.INVALID_ARGUMENT,
            )
        if args.root is not None:
            SessionId(args.root)  # a malformed ROOT is refused, never watched for
        with _open_existing(args.db) as store:
            return watch_tree(
                store, redacted_url(args.db), args.root, console, interval, args.count
            )
    with _open_existing(args.db) as store:
        return run_tree(store, redacted_url(args.db), args.root, args.json, console)


def _serve(args: argparse.Namespace, console: Console) -> int:
    from ._serve import TreeFeed, TreeServer

    interval = args.interval
    token = args.token if args.token is not None else "-"  # spaces, non-ASCII: unsendable
    if (
        not 0 < interval <= _LONGEST
        or not 0 <= args.port <= 65535
        or not _TOKEN.match(token)
        or args.max_clients < 1
    ):
        raise SubagentError(
            f"--interval takes seconds > 0 (at most {_LONGEST:.0f}), --port 0..65535,"
            " --token visible ASCII (no spaces), --max-clients a number >= 1",
            code=ErrorCode.INVALID_ARGUMENT,
        )
    if args.root is not None:
        # A malformed ROOT is refused (as by `tree`); one not stored yet is an error served.
        SessionId(args.root)
    with _open_existing(args.db) as store:
        feed = TreeFeed(store, redacted_url(args.db), args.root, interval)
        try:
            try:
                server = TreeServer(feed, args.host, args.port, args.token, args.max_clients)
            except OSError as exc:
                raise SubagentError(
                    f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
                    code=ErrorCode.INVALID_ARGUMENT,
                ) from exc
            with server:
                hint = ", with ?token=TOKEN" if args.token else ""
                console.print(f"serving {server.url} (Ctrl-C stops){hint}", markup=False)
                console.file.flush()
                server.serve_forever()
        finally:
            feed.close()
    return 0


class _Version(argparse.Action):
    """``--version``, its distribution read only when asked (argparse's own ``version``
    action takes the string when the parser is built, for every command)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.update(nargs=0, default=argparse.SUPPRESS)
        super().__init__(option_strings, argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any) -> None:
        print(f"subagents {_version()}")  # on stdout, as argparse's own action
        parser.exit()


def _version() -> str:
    """The installed distribution's version (``unknown`` when run from a bare tree)."""
    import importlib.metadata  # here: 50 ms of every command's start, for --version only

    try:
        return importlib.metadata.version("subagents")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


_SESSION_ID = re.compile(r"[0-9a-f]{32}")
#: The longest wait a thread can make (~292 years): a longer ``--watch`` or
#: ``--interval`` raised OverflowError from the sleep -- a traceback after the
#: first frame of ``tree``, the poller of ``serve`` dead and its page never updated.
_LONGEST = threading.TIMEOUT_MAX
_TOKEN = re.compile(r"[\x21-\x7e]+\Z")


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line, options and positionals in any order: argparse alone takes
    an optional ROOT before the options that follow it and then refuses the ROOT
    after them (``tree DB --json ROOT``); the command's own parser takes them
    intermixed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    for i, word in enumerate(argv[:-1]):
        # ``--watch`` takes an optional SECONDS: a session id after it is the ROOT
        # (no interval is 32 hex digits; some session ids read as numbers).
        if word == "--watch" and _SESSION_ID.fullmatch(argv[i + 1]):
            argv[i] = "--watch=1"
    args, extra = parser.parse_known_args(argv)
    if not extra or args.command is None:
        return parser.parse_args(argv)  # as usual: argparse's own error, exit 2
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    rest = argv[argv.index(args.command) + 1 :]
    namespace = argparse.Namespace(command=args.command)
    command: argparse.ArgumentParser = commands.choices[args.command]
    return command.parse_intermixed_args(rest, namespace)


class _Console(Console):
    """A console that goes quiet when its reader leaves (``| head``): the command
    finishes its work (a demo its tree) and exits as it would have. rich's own
    answer is ``SystemExit(1)``, an error status with no error."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        with contextlib.suppress(OSError):  # keep interpreter exit's flush quiet
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())


class _Terminated(BaseException):
    """``SIGTERM`` reached a long-running command (``serve``, ``tree --watch``).

    A ``BaseException``, as ``KeyboardInterrupt``: the server's loop handles a
    request's ``Exception`` and goes on serving -- a SIGTERM that landed while it
    started a request's thread was logged as that request's failure, and the
    server kept running."""


def _terminate(_signum: int, _frame: Any) -> None:
    raise _Terminated


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``subagents`` command (a bare ``subagents`` prints help)."""
    parser = _parser()
    args = _parse(parser, argv)
    if args.command is None:
        parser.print_help()
        return 0
    # A service manager stops ``serve`` (or a watch) with SIGTERM: it ends as
    # Ctrl-C does, its store closed, rather than dying of the signal.
    previous = None
    if args.command in ("serve", "tree") and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return _run(args)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    # A PostgreSQL server that went away is this command's one error line, not a
    # warning of the read pool's per reconnection attempt on stderr besides.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    # soft_wrap: lines stay whole when piped (grep-able), tables still fit the width.
    console = _Console(soft_wrap=True)
    if not console.is_terminal:
        console = _Console(soft_wrap=True, width=200)  # piped: never crop tree lines
    err = Console(stderr=True, soft_wrap=True)
    try:
        if args.command == "demo":
            from ._demo import run_demo

            return run_demo(args.db, args.backend, console, args.model)
        if args.command == "show":
            from ._show import show

            return show(args, console, _open_existing(args.db))
        if args.command == "tree":
            return _tree(args, console)
        if args.command == "serve":
            return _serve(args, console)
    except SubagentError as exc:
        text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        err.print(f"subagents {args.command}: {text}", markup=False, highlight=False)
        return 2
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except _Terminated:
        err.print("terminated")
        return 143
    except BrokenPipeError:  # `subagents tree DB | head`: the reader left, so do we
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep interpreter exit quiet
        return 0
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
