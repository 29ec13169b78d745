"""A runtime's presence on an SQLite file: a doorbell every process using the file
can ring, and a lock that says whether the runtime's process still lives.

Workers sharing one SQLite file run on one kernel, but not always in one PID or
network namespace: containers that mount the same volume see each other's files
and nothing else. A pid then says nothing (:mod:`._holders` judges only its own
namespace's), and a doorbell in the abstract socket namespace reaches only its
own network namespace. Files beside the database reach them all. So a runtime
on an SQLite file (:meth:`~subagents.store.SqliteStore.listen`) makes, in the
*meeting place* ``<database>-wake/``:

* ``<name>.lock``, on which it holds an exclusive ``flock`` as long as it lives.
  The kernel drops the lock when the process ends, however it ends (SIGKILL,
  the OOM killer): a lock anybody else can share means the holder is gone
  (:func:`presence_ended`). The file is locked under a temporary name and then
  renamed into place, so nobody ever finds it unlocked while its runtime lives.
* ``<name>``, a Unix datagram socket bound to that path: its doorbell's address,
  which the runtime records in its leases. A socket file is reached by path, so
  from any network namespace that sees the file.

A clean close removes both files (after every lease was released), and the
meeting place when no other presence is left in it. A killed
runtime's stay until a runtime opening the same file finds their lock free and
no live lease naming them (:func:`clear_stale`): until then they are how others
know it is gone. A runtime killed while it made its presence leaves the
temporary lock file, which the same cleaner removes once nobody holds it and it
is older than a making takes. Where the meeting place cannot be made (a
read-only folder, a path too long for a socket's address), there is no
presence: the runtime keeps the abstract doorbell, and its holders are judged
as before (by pid on this host, else at their leases' expiry).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Final

from ._forked import track

__all__ = ["Presence", "clear_stale", "meeting_place", "presence_ended"]

logger = logging.getLogger("subagents")

#: What the meeting place's name adds to the database file's.
SUFFIX: Final = "-wake"
#: The longest socket path (``sun_path`` less its terminating NUL).
_SUN_PATH: Final = 107
_LOCK: Final = ".lock"
#: The lock file's name while it is made (see :meth:`Presence.open`).
_MAKING: Final = ".tmp"
#: Seconds after which a temporary lock file nobody holds is a kill's leftover: a
#: making takes microseconds, from the file's creation to its rename.
_UNMADE_AGE: Final = 60.0
#: The largest ring, as the doorbell reads them.
_MAX_RING: Final = 1024


def meeting_place(database: str) -> str:
    """The meeting place of the SQLite file at ``database`` (an absolute path)."""
    return os.path.abspath(database) + SUFFIX


def presence_ended(wake: str | None) -> bool:
    """True when ``wake`` (a lease's wake address) is a presence's whose process has
    ended: its lock file is there and nobody holds it. False for a live one, for
    any other address, and when nothing can be told (no such file: an earlier
    version's doorbell, or one already cleared)."""
    if type(wake) is not str or not wake.startswith("/"):
        return False
    return _unheld(wake + _LOCK)


def _unheld(path: str) -> bool:
    """True when the file at ``path`` is there and nobody holds a lock on it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, ValueError):  # (ValueError: a NUL in a damaged wake address)
        return False
    try:
        # Shared: judges asking at once do not take each other for the holder.
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False  # held (EWOULDBLOCK): it lives; or cannot be told
    finally:
        os.close(fd)
    return True


class Presence:
    """This runtime's presence in a meeting place (see the module docstring): a
    ``subagents.store.Listener`` whose ``address`` is its socket's path.

    Made by :meth:`open`; :meth:`receive` is read by one task; :meth:`close` is
    idempotent and removes the files.
    """

    def __init__(self, address: str, lock_fd: int, sock: socket.socket) -> None:
        self.address = address
        self._lock_fd: int | None = lock_fd
        self._sock = sock
        self._closed = False
        track(self)

    @classmethod
    def open(cls, directory: str) -> Presence | None:
        """A presence in ``directory`` (made if missing), or None where there can be
        none here (the folder cannot be written, the path is too long)."""
        address = os.path.join(directory, uuid.uuid4().hex[:16])
        if len(os.fsencode(address)) > _SUN_PATH:
            logger.info("no presence in %s: its path is too long for a socket", directory)
            return None
        lock_fd: int | None = None
        sock: socket.socket | None = None
        temporary = address + _MAKING
        try:
            for attempt in (1, 2):
                os.makedirs(directory, exist_ok=True)
                # Locked under a name nobody judges, then renamed: never seen unlocked.
                try:
                    lock_fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
                    break
                except FileNotFoundError:  # a closing runtime's rmdir came between
                    if attempt == 2:
                        raise
            assert lock_fd is not None
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(temporary, address + _LOCK)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(address)
            sock.setblocking(False)
        except OSError as exc:
            logger.info("no presence in %s: %s", directory, exc)
            _remove(temporary, address + _LOCK, address)
            if sock is not None:
                sock.close()
            if lock_fd is not None:
                os.close(lock_fd)
            return None
        return cls(address, lock_fd, sock)

    def __repr__(self) -> str:
        return f"<Presence {self.address}{' closed' if self._closed else ''}>"

    def fileno(self) -> int | None:
        """The socket's descriptor, to wait on for rings (None once closed)."""
        return None if self._closed else self._sock.fileno()

    def receive(self) -> list[bytes] | None:
        """The rings that arrived (never None: a socket file is never disconnected)."""
        rings: list[bytes] = []
        while not self._closed:
            try:
                rings.append(self._sock.recv(_MAX_RING))
            except OSError:  # EAGAIN: none left (or closed meanwhile)
                break
        return rings

    def reconnect(self) -> bool:
        """Nothing to reopen (a socket file stays bound): True until closed."""
        return not self._closed

    def close(self) -> None:
        """Remove the files -- and the meeting place, when it is left empty -- then
        let go of the lock (a judge meanwhile finds no file: it cannot tell, and
        waits). Idempotent."""
        if self._closed:
            return
        self._closed = True
        _remove(self.address + _LOCK, self.address)
        with contextlib.suppress(OSError):  # (not empty: another runtime's are there)
            os.rmdir(os.path.dirname(self.address))
        self._sock.close()
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)

    def _forked(self) -> None:
        """In a fork's child: let go of the child's copy of the lock's descriptor --
        the lock is the parent's, and must end with the parent (an ``flock`` ends
        when every copy is closed). The files are the parent's: left alone."""
        self._closed = True
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def clear_stale(directory: str, live: Callable[[Iterable[str]], set[str]]) -> int:
    """Remove the files of ended presences in ``directory`` that no live lease names
    (``live``: of the addresses given, those a live lease records as its wake);
    returns how many presences went. Never raises: a cleaner that cannot is no
    reason to refuse a runtime."""
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    _clear_unmade(directory, names)
    found = [os.path.join(directory, name[: -len(_LOCK)]) for name in names if name.endswith(_LOCK)]
    ended = [address for address in found if presence_ended(address)]
    if not ended:
        return 0
    try:
        keep = live(ended)
    except Exception as exc:  # the store's: leave them for the next runtime
        logger.debug("clearing ended presences in %s: %s", directory, exc)
        return 0
    gone = [address for address in ended if address not in keep]
    for address in gone:
        _remove(address + _LOCK, address)
    return len(gone)


def _clear_unmade(directory: str, names: Iterable[str]) -> None:
    """Remove the temporary lock files of presences a kill cut short while they were
    made (between the file's creation and its rename into place): nobody holds
    their lock, and they are older than any making takes. They stayed for ever,
    and with them the meeting place."""
    now = time.time()
    for name in names:
        if not name.endswith(_MAKING):
            continue
        path = os.path.join(directory, name)
        try:
            young = now - os.stat(path).st_mtime < _UNMADE_AGE
        except OSError:
            continue  # (renamed meanwhile: made)
        if not young and _unheld(path):
            logger.debug("removing %s: a presence never made", path)
            _remove(path)


def _remove(*paths: str) -> None:
    """Unlink ``paths``; one already gone (another cleaner's) is no matter."""
    for path in paths:
        try:
            os.unlink(path)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                logger.debug("removing %s: %s", path, exc)
