"""The Prometheus endpoint of a real daemon, scraped and parsed as Prometheus would.
The figures a hang or a crash feeds (detection, recovery, decisions) are checked to
the event on virtual time in tests/fast/test_hangs.py."""

from __future__ import annotations

import os
import signal
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import RANKS, Daemon, wait_until

FAULTY = str(RANKS / "faulty.py")
BEHAVE = str(RANKS / "behave.py")
FAST = ("--nproc-per-node", "2", "--preload", "none")
Start = Callable[..., Daemon]
Samples = dict[str, list[Any]]


def _scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s)
    return samples


def _value(samples: Samples, name: str, **labels: str) -> float | None:
    hits = [s.value for s in samples.get(name, []) if labels.items() <= s.labels.items()]
    assert len(hits) <= 1, (name, labels, hits)
    return hits[0] if hits else None


def _ranks(samples: Samples, name: str) -> dict[str, Any]:
    return {s.labels["rank"]: s for s in samples.get(name, [])}


def _serving(d: Daemon) -> int:
    serving = d.wait_event("metrics_serving")[0]
    assert serving["addr"] == "127.0.0.1"  # loopback unless --metrics-addr says otherwise
    assert serving["url"] == f"http://127.0.0.1:{serving['port']}/metrics"
    return int(serving["port"])


def _settled(port: int, generation: int, ready: Callable[[Samples], bool]) -> Samples:
    """A scrape whose snapshot shows ``generation`` with both ranks running and heartbeating."""

    def check() -> Samples | None:
        s = _scrape(port)
        states = _ranks(s, "ft_supervisor_rank_state")
        ok = (
            _value(s, "ft_supervisor_generation") == generation
            and {r: x.labels["state"] for r, x in states.items()} == {"0": "running", "1": "running"}
            and len(_ranks(s, "ft_supervisor_rank_heartbeat_age_seconds")) == 2
            and ready(s)
        )
        return s if ok else None

    result: Samples = wait_until(check, 30, f"metrics of generation {generation}", interval=0.1)
    return result


def test_the_endpoint_serves_the_figures_before_and_after_a_crash(start: Start) -> None:
    d = start(*FAST, "--max-restarts", "2", "--metrics-port", "0",
              FAULTY, "--seconds", "60", "--later-seconds", "60")  # fmt: skip
    port = _serving(d)
    before = _settled(port, 0, lambda s: True)
    assert before["ft_supervisor_generation"][0].labels == {"run_id": "t", "node": socket.gethostname()}
    assert _value(before, "ft_supervisor_restarts_used") == 0
    assert _value(before, "ft_supervisor_restart_budget") == 2
    assert _value(before, "ft_supervisor_generations_started_total") == 1
    assert _value(before, "ft_supervisor_recovery_seconds_count") == 0
    assert "ft_supervisor_decisions_total" not in before
    for sample in _ranks(before, "ft_supervisor_rank_heartbeat_age_seconds").values():
        assert 0 <= sample.value < 5  # heartbeats every 10 ms; refreshed every second
    goodput = _value(before, "ft_supervisor_goodput_ratio")
    assert goodput is not None and 0 < goodput <= 1
    assert _value(before, "ft_supervisor_process_resident_memory_bytes")  # the daemon's own

    victim = next(e["pid"] for e in d.events("rank_spawned") if e["generation"] == 0 and e["rank"] == 1)
    d.wait_event("rank_stepping", where=lambda e: e["generation"] == 0, count=2)
    os.kill(victim, signal.SIGKILL)
    after = _settled(port, 1, lambda s: _value(s, "ft_supervisor_recovery_seconds_count") == 1)
    assert _value(after, "ft_supervisor_restarts_used") == 1
    assert _value(after, "ft_supervisor_generations_started_total") == 2
    assert _value(after, "ft_supervisor_decisions_total", action="restart", reason="rank_failed") == 1
    assert len(after["ft_supervisor_rank_state"]) == 2  # no series left over from generation 0
    for sample in _ranks(after, "ft_supervisor_rank_heartbeat_age_seconds").values():
        assert 0 <= sample.value < 5
    # the crash noticed -> every rank of generation 1 stepping, to the event
    crashed = next(e for e in d.events("rank_exited") if e["state"] == "failed")
    stepping = [e["t_mono"] for e in d.events("rank_stepping") if e["generation"] == 1]
    assert len(stepping) == 2
    recovery = _value(after, "ft_supervisor_recovery_seconds_sum")
    assert recovery == pytest.approx(max(stepping) - crashed["t_mono"], abs=1e-6)
    lost = _value(after, "ft_supervisor_run_seconds", part="restart")
    assert lost == pytest.approx(recovery, abs=0.01)  # the goodput ledger's figure for the same gap

    d.signal(signal.SIGTERM)
    assert d.wait() == 128 + signal.SIGTERM, d.stderr()
    with pytest.raises(urllib.error.URLError):
        _scrape(port)


def test_a_taken_port_is_reported_and_the_run_goes_on(start: Start) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        d = start(*FAST, "--metrics-port", str(port), BEHAVE, "--print", "hello")
        assert d.wait() == 0, d.story()
    unavailable = d.events("metrics_unavailable")
    assert [(e["addr"], e["port"]) for e in unavailable] == [("127.0.0.1", port)]
    assert "in use" in unavailable[0]["error"]
    assert not d.events("metrics_serving")
    assert "metrics_unavailable" in d.stderr()  # the console says so too
