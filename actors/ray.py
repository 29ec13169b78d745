"""Continuable children placed on a Ray cluster (the ``ray`` extra).

Ray decides *where* a child's Activation runs; the durable session, its lease
and its inbox stay in the store every process shares (a SQLite file for hosts on
one machine, PostgreSQL across machines)::

    import ray
    from subagents.actors.ray import RayPlacement

    ray.init()
    placement = RayPlacement("postgresql://db/tree?schema=s", setup=register_models)
    runtime.subagents.register_provider(placement)
    runtime.subagents.start_continuable(ContinuableStartSpec(
        parent=agent, label="crawler", prompt="...", provider="ray"))

A :class:`RayPlacement` is a provider whose continuable children run on a pool of
Ray actors, each a :class:`PlacementHost`: a runtime of its own on the shared
store (``setup(runtime)`` registers its models and tools). The parent's process
keeps each child as an Activation -- ownership, routing, drains, settling,
child-first release, all as for a local child (see
``subagents.actors._children._placed``). A follow-up is committed to the child's
durable inbox and its host asked to run what waits; a host that dies (its Ray
actor killed, its machine gone) leaves the child's lease to expire, and the next
call runs the child on another host, which replays what was accepted.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("subagents.actors.ray needs Ray: pip install 'subagents[ray]'") from exc

from subagents.actors._children import ContinuableCreateSpec
from subagents.actors._children._placed import _CALLS
from subagents.actors._kernel import telemetry_for
from subagents.actors._ray_checks import _bad, _check_arguments, _seconds
from subagents.actors._ray_host import PlacementHost, _RayHost
from subagents.actors._runtime import Runtime
from subagents.protocol import ErrorCode, SessionId, SubagentError

__all__ = ["PlacementHost", "RayPlacement"]

logger = logging.getLogger("subagents")

#: Seconds between a run's looks at whether its child was released meanwhile.
_POLL = 1.0
#: What ``_on_host`` answers for a call not carried out (no host, or it is gone).
_GONE: Any = object()
#: A child forgotten by the pool, not yet by its host: (host, child, call, runs).
_Forgetting = tuple[int, SessionId, int, list[Any]]


class RayPlacement:
    """A provider that runs continuable children on a pool of Ray actors.

    Args:
        store: the store the parent's runtime uses, as the hosts must open it
            (a path on this machine, or a ``postgresql://`` URL across machines).
        setup: ``setup(runtime)``, run in each host: register the models (and
            tools) its children use. It is pickled to the hosts, so a module-level
            function.
        hosts: the pool's size.
        name: the provider name children are started with.
        num_cpus, resources: each host actor's Ray resource request.
        max_restarts: how often Ray restarts a host that died (-1: always).
        lease_ttl: the hosts' lease ttl: how long a child is unreachable after its
            host died on another machine (on this machine a dead holder is seen at
            once).
        options: more ``ray.remote`` options for the host actors.
        start_timeout: seconds the constructor waits for every host to start
            (its runtime open, ``setup`` run).
        call_timeout: seconds a call that acts on a child where it is hosted
            (cancel, interrupt, settle, release) waits for its host; a host that
            does not answer by then is treated as gone (its lease expires), so a
            drain or a close never waits on it for ever. A run waits for the
            child's turns, however long they take.
        tracing: whether the hosts trace their children's turns and deliveries
            (``setup`` configures the OpenTelemetry provider there, as this process
            did); ``None``: when this process has a tracer provider configured.

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` for a bad pool size or options, or a
            host that failed to start (``setup`` raised, the store did not open);
            ``TIMEOUT`` when the hosts had not started after ``start_timeout``
            seconds (a cluster without the resources they ask for). The hosts
            started are stopped again.
    """

    capabilities = frozenset({"depth_limit", "tool_filter", "persona"})
    inherits_parent_context = False

    def __init__(
        self,
        store: str,
        *,
        setup: Callable[[Runtime], object] | None = None,
        hosts: int = 2,
        name: str = "ray",
        num_cpus: float = 0,
        resources: Mapping[str, float] | None = None,
        max_restarts: int = -1,
        lease_ttl: float = 30.0,
        options: Mapping[str, Any] | None = None,
        start_timeout: float = 120.0,
        call_timeout: float = 30.0,
        tracing: bool | None = None,
    ) -> None:
        _check_arguments(store, hosts, name, num_cpus, resources, max_restarts, lease_ttl, options)
        _seconds(start_timeout, "start_timeout")
        self._call_timeout = _seconds(call_timeout, "call_timeout")
        if tracing is None:
            tracing = telemetry_for(None) is not None
        elif type(tracing) is not bool:
            raise _bad("tracing is a bool or None")
        self.name = name
        #: The store the hosts open (a runtime registering this pool must be on it).
        self.store = store
        self.placement = self  # this provider places its children (see _placed)
        remote_options: dict[str, Any] = {
            "num_cpus": num_cpus,
            "max_restarts": max_restarts,
            "max_concurrency": 256,  # runs wait for quiet children: one per child
            **(options or {}),
        }
        if resources:
            remote_options["resources"] = dict(resources)
        self._hosts: list[Any] = []
        try:
            actor: Any = ray.remote(_RayHost).options(**remote_options)
            for _ in range(hosts):
                self._hosts.append(actor.remote(store, setup, lease_ttl=lease_ttl, tracing=tracing))
        except Exception as exc:  # Ray's checks of the options, setup's pickling, a name taken
            for h in self._hosts:
                ray.kill(h, no_restart=True)
            raise SubagentError(
                f"the hosts of {name!r} cannot be made: {type(exc).__name__}: {exc}"[:500],
                code=ErrorCode.INVALID_ARGUMENT,
            ) from None
        self._started(start_timeout, remote_options)
        self._lock = threading.Lock()
        self._where: dict[SessionId, int] = {}
        # The highest release call per child: a run asked before it is not carried
        # to another host after it (its release may have gone to a dead one).
        self._released: dict[SessionId, int] = {}
        # The highest cancel call dropping what waits, per child, with its cause: a
        # run asked before it drops what waits wherever it goes (a host that died
        # did not hear the cancel).
        self._dropped: dict[SessionId, tuple[int, str]] = {}
        # Hosts that did not answer a call in time, until when they count as gone.
        self._silent: dict[int, float] = {}
        # Hosts a child's run failed over from (they may hold markers of it).
        self._moved: dict[SessionId, set[int]] = {}
        # Runs returned from before their host answered, per child: until they
        # are carried out, their host keeps the child's markers (see forget).
        self._abandoned: dict[SessionId, list[Any]] = {}
        # Children forgotten here whose host forgets them once those runs are done:
        # (host, child, call below which its markers go, the runs).
        self._forgetting: list[_Forgetting] = []
        self._next = itertools.cycle(range(hosts))

    def __repr__(self) -> str:
        return f"<RayPlacement {self.name!r} hosts={len(self._hosts)}>"

    # -- the provider ------------------------------------------------------------------

    def prepare_continuable(self, request: Any) -> ContinuableCreateSpec:
        """A fresh history (the child's session is created by the parent's runtime)."""
        return ContinuableCreateSpec(seed=None)

    def start(self, request: Any, descriptor: Any) -> Any:
        """One-shot children are not placed: delegate them through ``local``."""
        raise SubagentError(
            f"provider {self.name!r} places continuable children; run one-shot children"
            " through 'local'",
            code=ErrorCode.INVALID_ARGUMENT,
        )

    @property
    def host_actors(self) -> list[Any]:
        """The pool's Ray actor handles (to inspect or kill one)."""
        return list(self._hosts)

    def host_of(self, child_id: SessionId | str) -> int | None:
        """The index of the host a child was last run on, or None (never run, or
        settled or released since)."""
        return self._where.get(SessionId(child_id))

    # -- the placement (what a PlacedChild calls) ---------------------------------------

    def run(
        self, child_id: SessionId, call: int | None = None, wake: Sequence[SessionId] = ()
    ) -> None:
        """Run what waits for ``child_id`` on its host (and for ``wake``, sessions
        below it, woken there); on another if that one died -- the one it was
        sent to is told to let the child go, in case it lives on, unreachable.
        A run asked before a release of the child returns once the release is
        asked, wherever it went: it is not carried to another host after it, nor
        waited on (a host that stopped answering)."""
        tried = 0
        while True:
            with self._lock:
                if self._released_after(child_id, call):
                    return
                i = self._assign(child_id)
                drop = self._dropped.get(child_id)
                if call is None or drop is None or drop[0] <= call:
                    drop = None
            wakes = [str(w) for w in wake]
            ref = self._hosts[i].run.remote(str(child_id), call, wakes, drop, tried)
            try:
                while True:
                    try:
                        self._get(ref, _POLL)
                        break
                    except GetTimeoutError:
                        with self._lock:
                            if self._released_after(child_id, call):
                                self._abandoned.setdefault(child_id, []).append(ref)
                                return
                self._silent.pop(i, None)
                return
            except RayActorError as exc:
                logger.warning("host %d of %s died running %s: %s", i, self.name, child_id, exc)
                with self._lock:
                    if self._where.get(child_id) == i:
                        self._where[child_id] = (i + 1) % len(self._hosts)
                    self._moved.setdefault(child_id, set()).add(i)
                if call is not None:  # not waited for: a dead host hears it restarted
                    # Ray cannot tell a dead host from one unreachable for a while: that
                    # one holds the child for this run, or takes it later. Let it go.
                    try:
                        self._hosts[i].let_go.remote(str(child_id), call, tried)
                    except Exception as let_go_exc:  # (a handle Ray refuses outright)
                        logger.warning("host %d of %s: %r", i, self.name, let_go_exc)
                tried += 1
                if tried > 2 * len(self._hosts):
                    raise SubagentError(
                        f"no host of {self.name!r} could run {child_id}",
                        code=ErrorCode.PERSISTENCE_UNAVAILABLE,
                    ) from exc

    def settle(self, child_id: SessionId, call: int | None = None) -> bool:
        """Release the child on its host if it is quiet there (True); False: busy.
        Numbered ``call``, a run asked before it that the host carries out after
        it (one this pool stopped waiting for) does not hold the child there."""
        out = self._on_host(child_id, "settle", call)
        if out is _GONE:  # a host that did not answer: its answer is not waited for,
            self.release(child_id, "settled", next(_CALLS))  # but it lets the child go
            return True
        return True if out is None else bool(out)

    def cancel(
        self, child_id: SessionId, cause: str, keep_inbox: bool, call: int | None = None
    ) -> None:
        """Cancel its running turn on its host (``keep_inbox=False``: and what waits;
        numbered ``call``, a run asked before it drops what waits wherever it goes,
        and one waiting on a host gone or silent returns, as after a release)."""
        drop = None if keep_inbox else call  # the number of a cancel dropping what waits
        if drop is not None:
            with self._lock:
                if drop > self._dropped.get(child_id, (0, ""))[0]:
                    self._dropped[child_id] = (drop, cause)
                self._assign(child_id)  # (a run not yet at a host goes there)
        if self._on_host(child_id, "cancel", cause, keep_inbox, call) is _GONE and drop is not None:
            with self._lock:  # its lease expires there; the durable inbox keeps the rest
                self._released[child_id] = max(drop, self._released.get(child_id, 0))

    def interrupt(self, child_id: SessionId, kind: str, by: SessionId | None) -> None:
        """An interrupt the parent's registry authorized, carried out on the host."""
        self._on_host(child_id, "interrupt", kind, None if by is None else str(by))

    def release(self, child_id: SessionId, cause: str, call: int | None = None) -> None:
        """Cancel it on its host, keeping what it accepted, and release it there."""
        if call is not None:
            with self._lock:
                self._released[child_id] = max(call, self._released.get(child_id, 0))
                # A run asked before this may not have reached the pool yet: the
                # host it will go to must know of this release, to ignore it.
                self._assign(child_id)
        self._on_host(child_id, "release", cause, call)

    def forget(self, child_id: SessionId) -> None:
        """The child settled or was released, and its stand-in asks nothing more:
        what this pool keeps of it goes, and its host forgets its markers (the
        calls that stop a late run from holding it again) once every run this
        pool stopped waiting for has been carried out -- the numbers of the next
        stand-in's calls are all higher."""
        with self._lock:
            hosts = self._moved.pop(child_id, set())
            i = self._where.pop(child_id, None)
            if i is not None:
                hosts.add(i)
            self._released.pop(child_id, None)
            self._dropped.pop(child_id, None)
            runs = self._abandoned.pop(child_id, [])
            below = next(_CALLS)
            self._forgetting.extend((h, child_id, below, runs) for h in sorted(hosts))
            due, self._forgetting = _done_runs(self._forgetting)
        by_host: dict[int, list[tuple[str, int]]] = {}
        for host, child, below, _ in due:
            by_host.setdefault(host, []).append((str(child), below))
        for host, pairs in by_host.items():  # not waited for: a lost one leaves markers
            self._hosts[host].forget.remote(pairs)

    def close(self, timeout: float = 60.0) -> None:
        """Release every hosted child and stop the host actors."""
        refs = [h.close.remote() for h in self._hosts]
        try:
            ray.get(refs, timeout=timeout)
        except Exception as exc:  # a host that died has nothing to release
            logger.warning("closing the hosts of %s: %s", self.name, exc)
        for h in self._hosts:
            ray.kill(h, no_restart=True)

    # -- internals ---------------------------------------------------------------------

    def _started(self, timeout: float, remote_options: Mapping[str, Any]) -> None:
        """Wait until every host started; stop them all and raise if one did not."""
        error: SubagentError
        try:
            ray.get([h.pid.remote() for h in self._hosts], timeout=timeout)
            return
        except GetTimeoutError:
            asked = {k: remote_options[k] for k in ("num_cpus", "resources") if k in remote_options}
            error = SubagentError(
                f"the hosts of {self.name!r} had not started after {timeout} s: does the"
                f" cluster have what each asks for ({asked})?",
                code=ErrorCode.TIMEOUT,
            )
        except RayActorError as exc:
            error = SubagentError(
                f"a host of {self.name!r} failed to start: {exc}"[:2000],
                code=ErrorCode.INVALID_ARGUMENT,
            )
        for h in self._hosts:
            ray.kill(h, no_restart=True)
        raise error

    def _assign(self, child_id: SessionId) -> int:
        """The child's host (the next of the pool for a new one); the caller holds
        the lock."""
        i = self._where.get(child_id)
        if i is None:
            i = self._where[child_id] = next(self._next)
        return i

    def _released_after(self, child_id: SessionId, call: int | None) -> bool:
        """Whether a release was asked after run ``call`` (the caller holds the lock)."""
        return call is not None and call < self._released.get(child_id, 0)

    def _on_host(self, child_id: SessionId, method: str, *args: Any) -> Any:
        """Call ``method`` on the host that holds the child; None when it has none,
        ``_GONE`` when its host died (its lease expires: nothing there to act on). A
        host that did not answer in ``call_timeout`` counts as gone for as long
        again: the calls for its other children (a close, a drain) are sent to it,
        not waited for -- it carries them out if it answers again."""
        i = self._where.get(child_id)
        if i is None:
            return None
        ref = getattr(self._hosts[i], method).remote(str(child_id), *args)
        if self._silent.get(i, 0.0) > time.monotonic():  # sent, not waited for
            logger.info("host %d of %s is silent: %s of %s not awaited", i, self.name, method,
                        child_id)  # fmt: skip
            return _GONE
        try:
            out = self._get(ref, self._call_timeout)
        except (RayActorError, GetTimeoutError) as exc:
            if isinstance(exc, GetTimeoutError):
                self._silent[i] = time.monotonic() + self._call_timeout
            logger.warning(
                "host %d of %s is gone (%s of %s): %s", i, self.name, method, child_id, exc
            )
            return _GONE
        self._silent.pop(i, None)
        return out

    @staticmethod
    def _get(ref: Any, timeout: float | None = None) -> Any:
        try:
            return ray.get(ref, timeout=timeout)
        except RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, SubagentError):
                raise SubagentError(
                    str(cause.args[0] if cause.args else cause), code=cause.code
                ) from None
            raise


def _done_runs(entries: list[_Forgetting]) -> tuple[list[_Forgetting], list[_Forgetting]]:
    """``entries`` split: those whose runs all returned (or failed), the others."""
    refs = [r for e in entries for r in e[3]]
    ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
    done = [e for e in entries if all(r in ready for r in e[3])]
    return done, [e for e in entries if not all(r in ready for r in e[3])]
