"""torch.distributed.elastic's rendezvous, as the coordinator uses it. Blocking: call from a thread.

The c10d and etcd-v2 backends are torch's dynamic rendezvous (the machinery
torchrun and ft_launcher use): a shared state, compare-and-set in a store, with
a keep-alive per node; the static backend is torch's fixed-rank TCPStore.
The dynamic backends come through torch's public handler registry under names of
our own (``ft-supervisor-c10d``, ``ft-supervisor-etcd-v2``, registered when a
TorchRendezvous is made): torch's backend and store, and a handler of ours
(``torch_private``) that looks at the state quickly at the start of a round and
keeps alive at its own phase. Importing this module changes nothing of torch's. Reading who is in the
round, who waits and whose keep-alive is stale needs the dynamic handler's state:
``torch_private`` is the one place that reads it, and
``tests/component/test_rendezvous.py`` fails the day torch changes its shape.
"""

from __future__ import annotations

import datetime
import importlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from torch.distributed import DistStoreError, PrefixStore, Store, TCPStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousParameters,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
    rendezvous_handler_registry,
)

from supervisor.clock import SYSTEM, Clock
from supervisor.config.rendezvous import RdzvConfig
from supervisor.coord import torch_private
from supervisor.coord.pace import Pace
from supervisor.coord.torch_private import Snapshot

T = TypeVar("T")

OUR_PREFIX = "ft-supervisor"
SHARE_STORE_OPT_OUT = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"

# etcd is a cluster: while it elects a leader (its old one died, or a member is slow on
# a busy node) requests fail with "request timed out" for seconds, and then it serves
# again. An error of the etcd client is retried for this long before the rendezvous
# counts as lost. A c10d store is one process: its errors mean its host is gone.
STORE_PATIENCE = 30.0
PACE = Pace()  # how a round's start is paced (pace.py); scripts/bench/scale.py sets its own
# Our names in torch's handler registry, for torch's dynamic backends of these names
NAMES = {"c10d": f"{OUR_PREFIX}-c10d", "etcd-v2": f"{OUR_PREFIX}-etcd-v2"}
_TUNING = f"{OUR_PREFIX}.tuning"  # the key of a Tuning in RendezvousParameters' options


@dataclass(frozen=True, slots=True)
class Tuning:
    """What a TorchRendezvous hands its handler through torch's registry, which
    passes the creator nothing but RendezvousParameters."""

    pace: Pace
    clock: Clock


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torch's registry calls this for our names; it keeps torch's handler
    machinery, backend and store, and hands the coordinator what it made."""
    kind = next(kind for kind, name in NAMES.items() if name == params.backend)
    module = "c10d_rendezvous_backend" if kind == "c10d" else "etcd_rendezvous_backend"
    made = importlib.import_module(f"torch.distributed.elastic.rendezvous.{module}")
    backend, store = made.create_backend(params)
    tuning = params.get(_TUNING) or Tuning(PACE, SYSTEM)
    return torch_private.build(store, backend, params, tuning.pace, tuning.clock)


def register() -> None:
    """Our names in torch's registry (again is a no-op: the creator is the same)."""
    for name in NAMES.values():
        rendezvous_handler_registry.register(name, create_handler)


def transient(exc: BaseException) -> bool:
    """An error a distributed store recovers from: its client's (python-etcd,
    urllib3), or torch's wrapping of one (RendezvousConnectionError)."""
    if isinstance(exc, RendezvousConnectionError):
        return True
    return type(exc).__module__.split(".")[0] in ("etcd", "urllib3")


class Patience:
    """Retries of transient store errors, within a bound, backing off to a second."""

    def __init__(
        self,
        seconds: float,
        sleep: Callable[[float], None] = SYSTEM.pause,
        clock: Callable[[], float] = SYSTEM.monotonic,
    ) -> None:
        self.seconds, self._sleep, self._clock = seconds, sleep, clock

    def __call__(self, fn: Callable[[], T], what: str) -> T:
        deadline = self._clock() + self.seconds
        delay = 0.1
        while True:
            try:
                return fn()
            except Exception as exc:
                if not transient(exc):
                    raise
                if self._clock() + delay > deadline:
                    raise RendezvousEnded(
                        "unreachable", f"{what}: the store kept failing for {self.seconds:g} s: {_why(exc)}"
                    ) from None
                self._sleep(delay)
                delay = min(1.0, delay * 2)


class PatientStore:
    """The store operations the coordinator uses, each retried through ``patience``."""

    def __init__(self, store: Store, patience: Patience) -> None:
        self._store, self._patience = store, patience

    def wait(self, keys: list[str], seconds: float) -> bool:
        """Block until every key exists (True) or ``seconds`` pass (False): the
        store answers when a key is set, so a node waiting costs it no requests."""

        def wait() -> bool:
            try:
                self._store.wait(keys, datetime.timedelta(seconds=seconds))
            except LookupError:  # etcd's EtcdStore: "Timeout while waiting for keys"
                return False
            except DistStoreError as exc:  # TCPStore: "wait timeout after ..."
                if "timeout" not in str(exc).lower():
                    raise
                return False
            return True

        return bool(self._patience(wait, f"wait {keys}"))

    def get_many(self, keys: list[str]) -> list[bytes]:
        """Keys that exist, in one request where the store can (TCPStore)."""
        try:
            return [bytes(v) for v in self._patience(lambda: self._store.multi_get(keys), "multi_get")]
        except (RuntimeError, NotImplementedError) as exc:
            if not _unimplemented(exc):
                raise
        return [self.get(k) for k in keys]

    def add(self, key: str, value: int) -> int:
        return int(self._patience(lambda: self._store.add(key, value), f"add {key}"))

    def get(self, key: str) -> bytes:
        return bytes(self._patience(lambda: self._store.get(key), f"get {key}"))

    def set(self, key: str, value: str) -> None:
        self._patience(lambda: self._store.set(key, value), f"set {key}")

    def check(self, keys: list[str]) -> bool:
        return bool(self._patience(lambda: self._store.check(keys), "check"))

    def first(self, key: str, value: str, seconds: float = 30.0) -> str:
        """Set ``key`` to ``value`` unless it is set; what it holds now. One compare-and-set
        (TCPStore's sets a missing key); without one (EtcdStore) the first to count itself
        sets it, the others wait ``seconds`` at most (then ``value``: nothing to compare)."""
        try:
            got = self._patience(lambda: self._store.compare_set(key, "", value), f"first {key}")
            return bytes(got).decode()
        except (RuntimeError, NotImplementedError) as exc:
            if not _unimplemented(exc):
                raise
        if self.add(f"{key}/claims", 1) == 1:
            self.set(key, value)
            return value
        return self.get(key).decode() if self.wait([key], seconds) else value


def _unimplemented(exc: BaseException) -> bool:
    """A store in Python (etcd's EtcdStore) lacks the operation (torch: "Not implemented")."""
    return not isinstance(exc, DistStoreError) and "not implemented" in str(exc).lower()


def _why(exc: BaseException) -> str:
    """The error and what caused it: torch wraps the store's own error ("The connection
    to etcd has failed. See inner exception for details.")."""
    cause = exc.__cause__ or exc.__context__
    return f"{exc} ({type(cause).__name__}: {cause})" if cause is not None else str(exc)


class RendezvousEnded(Exception):
    """The rendezvous cannot go on: ``kind`` is closed, timeout or unreachable."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Listeners:
    """A round's keys over two connections of their own, for the blocking waits of
    the watch (a peer's generation ended) and of the agreement (the round decided):
    a TCPStore client serves one request at a time, and torch's keep-alive and our
    other calls must not queue behind a wait. Each round opens its own, so that a
    wait left over from the last round never queues the next one's, in the
    background: a slow connect (the store's host waiting on reverse DNS for the
    resolver's timeout, 5 s; see services/reverse_dns.py) must not hold up the join.
    etcd's client is HTTP and serves each call on its own: it is shared."""

    def __init__(self, store: PatientStore, open_one: Callable[[], PatientStore] | None) -> None:
        self._ready = threading.Event()
        self._stores: list[PatientStore] = [store, store]
        self._error: Exception | None = None
        if open_one is None:
            self._ready.set()
            return
        threading.Thread(target=self._open, args=(open_one,), name="rdzv-listeners", daemon=True).start()

    def _open(self, open_one: Callable[[], PatientStore]) -> None:
        try:
            self._stores = [open_one(), open_one()]
        except Exception as exc:  # the store is gone: the waiting side names it
            self._error = exc
        finally:
            self._ready.set()

    def ready(self) -> bool:
        return self._ready.is_set()

    def get(self, which: int) -> PatientStore:
        """Blocks until the connections are open (0: the watch's, 1: the agreement's)."""
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self._stores[which]


@dataclass(frozen=True, slots=True)
class Joined:
    """One completed rendezvous round, as this node sees it."""

    round: int
    node_rank: int
    nnodes: int
    me: str
    members: dict[int, str]  # node rank -> node identity ("" for the static backend)
    store: PatientStore  # our keys for this round only
    master_addr: str
    master_port: int
    listeners: Listeners  # for the blocking waits of the watch and of the agreement


class TorchRendezvous:
    def __init__(self, cfg: RdzvConfig, clock: Clock = SYSTEM) -> None:
        self.cfg = cfg
        self._clock = clock
        conf: dict[str, Any] = dict(cfg.conf)
        if cfg.backend == "static":
            conf["rank"] = cfg.node_rank
        else:
            conf[_TUNING] = Tuning(PACE, clock)
            conf["heartbeat_timeout"] = cfg.keep_alive_deadline
        self._params = RendezvousParameters(
            backend=NAMES.get(cfg.backend, cfg.backend),
            endpoint=cfg.endpoint,
            run_id=cfg.run_id,
            min_nodes=cfg.min_nodes,
            max_nodes=cfg.max_nodes,
            local_addr=cfg.local_addr,
            **conf,
        )
        # Torch's handler shares one TCPStore server per agent with the ranks, and
        # then publishes its address only when it first becomes node 0: a node
        # joining later as node 1 waits forever for it. Our ranks host their own
        # store every generation anyway (see core.topology), so opt out.
        os.environ[SHARE_STORE_OPT_OUT] = "1"
        self._backend: Any = None
        self._base: PatientStore | None = None
        self.fallback: str | None = None  # why torch's rendezvous runs at torch's own pace here
        self.torch = torch_private.version()
        patience = STORE_PATIENCE if cfg.backend == "etcd-v2" else 0.0
        self.patience = Patience(patience, sleep=clock.pause, clock=clock.monotonic)
        try:
            if cfg.backend == "static":
                from torch.distributed.elastic.rendezvous import static_tcp_rendezvous  # noqa: PLC0415

                self._handler: Any = static_tcp_rendezvous.create_rdzv_handler(self._params)
            else:
                register()
                # etcd-v2 imports python-etcd: only when asked for
                handler = rendezvous_handler_registry.create_handler(self._params)
                assert isinstance(handler, torch_private.Handler), handler
                self._handler, self._backend = handler, handler.state_backend
                self.fallback = handler.fallback
                store = PrefixStore(f"{OUR_PREFIX}/{cfg.run_id}", handler.state_store)
                self._base = PatientStore(store, self.patience)
        except ImportError as exc:
            raise RendezvousEnded(
                "unreachable", f"--rdzv-backend {cfg.backend} needs {exc.name}: {exc}"
            ) from None
        except (RendezvousError, RuntimeError, ValueError, TimeoutError) as exc:
            raise RendezvousEnded(
                "unreachable", f"cannot reach the rendezvous at {cfg.endpoint}: {exc}"
            ) from None

    @property
    def base(self) -> PatientStore:
        """Keys of the whole run (every round): node status, why the job ended."""
        if self._base is None:
            raise RendezvousEnded("unreachable", "the static rendezvous has not started yet")
        return self._base

    def join(self, generation: int, master_port: int) -> Joined:
        """The next round: blocks until it completes, for up to the join timeout."""
        try:
            info = self._next_rendezvous()
            node_rank, nnodes = info.rank, info.world_size
            if self.cfg.backend == "static":
                if self._base is None:
                    self._base = PatientStore(PrefixStore(OUR_PREFIX, info.store), self.patience)
                number, members, me = generation, dict.fromkeys(range(nnodes), ""), ""
                store = PrefixStore(f"{OUR_PREFIX}/g{generation}", info.store)
                # a listener's bare TCPStore needs torch's static prefix (the run id) too, or
                # no node hears a round's news or decision: every generation's end hangs
                prefix = f"{self.cfg.run_id}/{OUR_PREFIX}/g{generation}"
            else:
                number, ranks, me = self._handler.members()  # of the state that made this round
                members = {rank: who for who, rank in ranks.items()}
                store = PrefixStore(OUR_PREFIX, info.store)  # already the round's prefix
                # torch's prefix for the round (DynamicRendezvousHandler._wrap_store), then ours:
                # test_rendezvous checks that a listener reads what the round's store wrote
                prefix = f"torch.rendezvous.{self.cfg.run_id}.{number}/{OUR_PREFIX}"
            master = RendezvousStoreInfo.build(node_rank, store, self.cfg.local_addr, server_port=master_port)
        except RendezvousGracefulExitError as exc:
            raise RendezvousEnded(
                "closed", f"the job ended while this node waited as a spare: {exc}"
            ) from None
        except RendezvousClosedError as exc:
            raise RendezvousEnded(
                "closed", f"the rendezvous is closed: the job ended elsewhere {exc}"
            ) from None
        except RendezvousTimeoutError:
            raise RendezvousEnded(
                "timeout",
                f"fewer than {self.cfg.min_nodes} node(s) joined within join_timeout "
                f"{self.cfg.seconds('join_timeout')} s",
            ) from None
        except (RendezvousConnectionError, RendezvousError, RuntimeError, TimeoutError) as exc:
            raise RendezvousEnded(
                "unreachable", f"rendezvous at {self.cfg.endpoint} failed: {_why(exc)}"
            ) from None
        ours = PatientStore(store, self.patience)
        return Joined(number, node_rank, nnodes, me, members, ours, master.master_addr, master.master_port,
                      Listeners(ours, self._opener(info.store, prefix)))  # fmt: skip

    def _opener(self, raw: Any, prefix: str) -> Callable[[], PatientStore] | None:
        """How to open another connection to ``raw`` (a TCPStore) under ``prefix``: a
        new client, not ``clone()``, which may hold the original's lock while it connects."""
        inner = getattr(raw, "underlying_store", raw)  # torch's round prefix wraps the TCPStore
        if not isinstance(inner, TCPStore):
            return None
        host, port, timeout = inner.host, inner.port, inner.timeout  # type: ignore[attr-defined]

        def open_one() -> PatientStore:
            conn = TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)
            return PatientStore(PrefixStore(prefix, conn), self.patience)

        return open_one

    def _next_rendezvous(self) -> Any:
        """Torch's next round; a transient store error (an etcd election) is retried
        while the join timeout lasts: torch's handler keeps its place in the round."""
        deadline = self._clock.monotonic() + self.cfg.seconds("join_timeout")
        while True:
            try:
                return self._handler.next_rendezvous()
            except RendezvousConnectionError:
                if self.patience.seconds <= 0 or self._clock.monotonic() + 1.0 > deadline:
                    raise
                self._clock.pause(1.0)

    def snapshot(self) -> Snapshot | None:
        """The shared state now; None for the static backend (it has none)."""
        if self._backend is None:
            return None
        return torch_private.snapshot(self.patience(self._backend.get_state, "the rendezvous state"))

    def leave(self) -> None:
        """Take this node out of the round at once, so the others need not wait
        for its keep-alive to go stale before they complete the next one."""
        if self._backend is None:
            return
        self._handler.leave(self._clock.monotonic() + self.cfg.seconds("close_timeout"))

    def close(self) -> None:
        """The job is over: nodes still waiting (spares) are let go."""
        self._handler.shutdown()
