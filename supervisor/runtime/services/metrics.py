"""The Prometheus endpoint (``--metrics-port``): the daemon's figures for a scraper.

Two feeds, both on the event loop. Every event passes through ``on_event`` (an
``EventLog`` listener), which drives the counters, the detection and recovery
histograms and the goodput ledger. Once a second ``refresh`` turns the status
data (what ``ft-supervisor status`` shows) into the gauges: a new snapshot
replaces the old one whole, so a scrape never sees half of one, and ranks that
are gone (a new generation, fewer ranks) leave no stale series behind.

The HTTP server is prometheus_client's WSGI app in its threading server, in a
thread of its own; it reads the registry and never touches the loop's objects.
Metrics are an observer: a port that cannot be bound is reported
(``metrics_unavailable``) and the run goes on without them; so does a refresh
that fails (``metrics_failed``, once per error).

Detection time is observed for hangs only: how long after its deadline the
daemon declared it (``rank_hung``'s ``late_by``, by the deadline's kind). A
crash is noticed by the child watcher when the kernel reports the exit; the
daemon cannot date the exit itself any earlier, so it observes nothing there.
(The goodput ledger's *detection* is another figure: from the rank's last sign
of life, about the timeout for a hang and 0 for a crash; it is in
``ft_supervisor_run_seconds{part="detection"}``.)
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from supervisor.clock import SYSTEM
from supervisor.config.metrics import MetricsConfig
from supervisor.core.catalogue import decode
from supervisor.core.catalogue.generation import Decision, GenerationStarted
from supervisor.core.catalogue.ranks import RankHung
from supervisor.core.catalogue.services import MetricsFailed, MetricsServing, MetricsUnavailable
from supervisor.core.goodput import Ledger
from supervisor.core.recovery import Recovery
from supervisor.runtime.records.events import EventLog

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric

PREFIX = "ft_supervisor_"
REFRESH = 1.0  # seconds between two snapshots of the status data
MAX_CLIENTS = 8  # scrapes served at once (each is a thread)
CLIENT_TIMEOUT = 5.0  # seconds a client may keep a connection silent
# how often the server looks for a shutdown request: the daemon's exit waits this long at most
POLL = 0.1
# a hang is declared by a timer at its deadline: milliseconds, unless the loop was starved
DETECTION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
RECOVERY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
BASE = ("run_id", "node")


class _Snapshot:
    """A collector that serves the metric families of the last refresh."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)  # the list is replaced, never changed: safe across threads


class Metrics:
    def __init__(self, events: EventLog, run_id: str, node: str, wall: Callable[[], float]) -> None:
        # the optional extra: imported only when metrics are asked for, so a daemon
        # without them neither needs the package nor pays for its import
        from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector  # noqa: PLC0415

        self.registry = CollectorRegistry()
        self._events = events
        self._base = (run_id, node)
        self._wall = wall
        self._failures: set[str] = set()  # refresh errors already reported
        r = self.registry
        self._generations = Counter(
            PREFIX + "generations_started", "generations started on this node", BASE, registry=r
        ).labels(*self._base)
        self._decisions = Counter(
            PREFIX + "decisions", "decisions after a generation ended, by action and reason",
            (*BASE, "action", "reason"), registry=r,
        )  # fmt: skip
        self._detection = Histogram(
            PREFIX + "detection_seconds",
            "how long after its deadline a hang was declared, by the deadline's kind",
            (*BASE, "kind"), buckets=DETECTION_BUCKETS, registry=r,
        )  # fmt: skip
        self._recovery = Histogram(
            PREFIX + "recovery_seconds",
            "from a failure noticed to every rank of the next generation stepping",
            BASE, buckets=RECOVERY_BUCKETS, registry=r,
        ).labels(*self._base)  # fmt: skip
        self._snapshot = _Snapshot()
        r.register(self._snapshot)
        ProcessCollector(namespace=PREFIX.rstrip("_"), registry=r)  # the daemon's own RSS, CPU, fds
        self._recovery_clock = Recovery()
        self._ledger = Ledger()
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    # -- the endpoint ------------------------------------------------------------------

    def serve(self, addr: str, port: int) -> tuple[str, int]:
        """Listen and serve in a thread; the address and port bound. OSError if it cannot."""
        # http.server and wsgiref cost the daemon 2 MiB: imported only when serving
        from wsgiref.simple_server import WSGIRequestHandler, make_server  # noqa: PLC0415

        from prometheus_client import make_wsgi_app  # noqa: PLC0415
        from prometheus_client.exposition import ThreadingWSGIServer  # noqa: PLC0415

        class _Quiet(WSGIRequestHandler):
            timeout = CLIENT_TIMEOUT  # a client that stops talking gives its thread back

            def log_message(self, format: str, *args: Any) -> None:
                pass  # a scrape is not news; stderr is the console

        slots = threading.BoundedSemaphore(MAX_CLIENTS)
        family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

        class _Bounded(ThreadingWSGIServer):
            """At most MAX_CLIENTS threads: a connection beyond them is closed at once."""

            address_family = family
            # socketserver's default accept queue is 5: a burst of connections beyond it
            # (slow clients, as in issue 12) had the kernel drop their SYNs, and every
            # client, a scrape included, waited out a retransmission (1 s, then 3 s...)
            request_queue_size = 128

            def process_request(self, request: Any, client_address: Any) -> None:
                if not slots.acquire(blocking=False):
                    self.shutdown_request(request)
                    return
                try:
                    super().process_request(request, client_address)
                except Exception:
                    slots.release()
                    raise

            def handle_error(self, request: Any, client_address: Any) -> None:
                # a client that timed out or hung up is not news: socketserver would print
                # a traceback on the console for each, which a slow client could flood
                if not isinstance(sys.exc_info()[1], OSError):
                    super().handle_error(request, client_address)

            def process_request_thread(self, request: Any, client_address: Any) -> None:
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    slots.release()

        server_class = _Bounded
        server: WSGIServer = make_server(
            addr, port, make_wsgi_app(self.registry), server_class, handler_class=_Quiet
        )
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": POLL}, name="metrics", daemon=True
        )
        self._thread.start()
        host, bound = server.server_address[:2]
        return str(host), int(bound)

    def close(self) -> None:
        if self._server is None or self._thread is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._server = None

    # -- the feeds -----------------------------------------------------------------------

    def on_event(self, name: str, record: dict[str, Any]) -> None:
        self._ledger.add(name, record)
        event = decode(record)  # typed: a renamed field fails mypy here, not a scrape
        if isinstance(event, GenerationStarted):
            self._generations.inc()
        elif isinstance(event, Decision):
            self._decisions.labels(*self._base, event.action, event.reason).inc()
        elif isinstance(event, RankHung):
            self._detection.labels(*self._base, event.kind).observe(event.late_by)
        seconds = self._recovery_clock.add(name, record)
        if seconds is not None:
            self._recovery.observe(seconds)

    def refresh(self, status: Mapping[str, Any]) -> None:
        self._snapshot.families = list(self._families(status))

    async def refresh_forever(self, status: Callable[[], Mapping[str, Any]]) -> None:
        while True:
            try:
                self.refresh(status())
            except Exception as exc:  # an observer's bug must not end the run
                if repr(exc) not in self._failures:
                    self._failures.add(repr(exc))
                    self._events.emit(MetricsFailed(error=repr(exc)))
            await SYSTEM.sleep(REFRESH)

    def _families(self, status: Mapping[str, Any]) -> Iterator[Metric]:
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily  # noqa: PLC0415

        base = list(self._base)

        def gauge(name: str, doc: str, value: float | None) -> Iterator[Metric]:
            if value is not None:
                family = GaugeMetricFamily(PREFIX + name, doc, labels=BASE)
                family.add_metric(base, value)
                yield family

        yield from gauge("generation", "the current generation (0 first)", status.get("generation"))
        yield from gauge("restarts_used", "restarts spent of the budget", status.get("restarts_used"))
        yield from gauge("restart_budget", "restarts allowed (--max-restarts)", status.get("max_restarts"))
        yield from gauge("uptime_seconds", "seconds since the daemon started", status.get("uptime_s"))
        so_far = self._ledger.summary(self._wall())
        yield from gauge("goodput_ratio", "productive share of the run's wall time so far", so_far.goodput)
        parts = GaugeMetricFamily(
            PREFIX + "run_seconds",
            "the run's wall time so far, by part (they add up to the wall time)",
            labels=(*BASE, "part"),
        )
        for part in ("productive", "detection", "restart", "recomputation", "overhead"):
            # without steps the ranks' running time is not called productive (start-up is in it)
            name = "running" if part == "productive" and not so_far.steps_known else part
            parts.add_metric([*base, name], getattr(so_far, part))
        yield parts
        ranks = status.get("ranks") or []
        per_rank = (*BASE, "rank")
        state = GaugeMetricFamily(
            PREFIX + "rank_state", "1 for each rank's current state", labels=(*per_rank, "state")
        )
        age = GaugeMetricFamily(
            PREFIX + "rank_heartbeat_age_seconds", "seconds since the rank's last heartbeat", labels=per_rank
        )
        iteration = GaugeMetricFamily(
            PREFIX + "rank_iteration", "the rank's last reported iteration", labels=per_rank
        )
        slow = GaugeMetricFamily(
            PREFIX + "rank_straggler_score",
            "the rank's own work per step over the node's typical rank's (1: as fast; flagged at the "
            "--straggler-threshold)",
            labels=per_rank,
        )
        for row in ranks:
            rank = str(row["rank"])
            state.add_metric([*base, rank, row["state"]], 1)
            if row.get("heartbeat_age") is not None:
                age.add_metric([*base, rank], row["heartbeat_age"])
            if row.get("iteration") is not None:
                iteration.add_metric([*base, rank], row["iteration"])
            if row.get("straggler_score") is not None:
                slow.add_metric([*base, rank], row["straggler_score"])
        yield from (state, age, iteration, slow)
        received = CounterMetricFamily(PREFIX + "messages_received", "messages from the ranks", labels=BASE)
        received.add_metric(base, status.get("received", 0))
        dropped = CounterMetricFamily(PREFIX + "messages_dropped", "messages dropped, by reason",
                                      labels=(*BASE, "reason"))  # fmt: skip
        for reason, n in (status.get("dropped") or {}).items():
            dropped.add_metric([*base, reason], n)
        yield from (received, dropped)
        yield from _advice(status.get("checkpoint_interval"), base)
        yield from _snapshots(status.get("snapshots"), base)


def _snapshots(held: Mapping[str, Any] | None, base: list[str]) -> Iterator[Metric]:
    """The memory snapshots the daemon holds: per rank the newest step, its age and size;
    the bytes held and the budget (docs: guides/checkpoints.md)."""
    from prometheus_client.metrics_core import GaugeMetricFamily  # noqa: PLC0415

    if not held:
        return
    per_rank = (*BASE, "rank")
    step = GaugeMetricFamily(PREFIX + "snapshot_step", "the newest step the rank's snapshots hold complete",
                             labels=per_rank)  # fmt: skip
    age = GaugeMetricFamily(PREFIX + "snapshot_age_seconds", "seconds since that snapshot was complete",
                            labels=per_rank)  # fmt: skip
    size = GaugeMetricFamily(PREFIX + "snapshot_bytes", "that snapshot's size", labels=per_rank)
    for rank, row in sorted((held.get("ranks") or {}).items()):
        step.add_metric([*base, str(rank)], row["step"])
        age.add_metric([*base, str(rank)], row["age_s"])
        size.add_metric([*base, str(rank)], row["bytes"])
    yield from (step, age, size)
    for name, doc, key in (("snapshot_memory_bytes", "bytes of slot files held for the ranks", "bytes"),
                           ("snapshot_memory_budget_bytes", "--snapshot-memory", "budget")):  # fmt: skip
        if isinstance(held.get(key), int):
            family = GaugeMetricFamily(PREFIX + name, doc, labels=BASE)
            family.add_metric(base, held[key])
            yield family


def _advice(advice: Mapping[str, Any] | None, base: list[str]) -> Iterator[Metric]:
    """The advised checkpoint interval and its inputs, those known (docs: guides/checkpoints.md)."""
    from prometheus_client.metrics_core import GaugeMetricFamily  # noqa: PLC0415

    if not advice:
        return
    if advice.get("seconds") is not None:
        advised = GaugeMetricFamily(PREFIX + "checkpoint_interval_advised_seconds",
                                    "the availability-optimal checkpoint interval, on this run's figures",
                                    labels=BASE)  # fmt: skip
        advised.add_metric(base, advice["seconds"])
        yield advised
    inputs = GaugeMetricFamily(PREFIX + "checkpoint_interval_input_seconds",
                               "what the advice is computed from: ts (a save), tf (mean time to "
                               "failure), tr (a recovery)", labels=(*BASE, "input"))  # fmt: skip
    for name in ("ts", "tf", "tr"):
        if advice.get(name) is not None:
            inputs.add_metric([*base, name], advice[name])
    yield inputs


def start_metrics(
    cfg: MetricsConfig, events: EventLog, *, run_id: str, node: str, wall: Callable[[], float]
) -> Metrics | None:
    """Serve metrics when asked to; None when off or when the endpoint cannot be had."""
    if cfg.port is None:
        return None
    metrics = Metrics(events, run_id, node, wall)
    try:
        addr, port = metrics.serve(cfg.addr, cfg.port)
    except OSError as exc:
        events.emit(MetricsUnavailable(addr=cfg.addr, port=cfg.port, error=exc.strerror or str(exc)))
        return None
    events.listeners.append(metrics.on_event)
    events.emit(MetricsServing(addr=addr, port=port, url=f"http://{_host(addr)}:{port}/metrics"))
    return metrics


def _host(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr


async def refresh_metrics(metrics: Metrics | None, status: Callable[[], Mapping[str, Any]]) -> None:
    """The daemon's refresh task (nothing to do when metrics are off)."""
    if metrics is not None:
        await metrics.refresh_forever(status)


def close_metrics(metrics: Metrics | None) -> None:
    if metrics is not None:
        metrics.close()
