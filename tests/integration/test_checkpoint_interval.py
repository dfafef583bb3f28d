"""The advised checkpoint interval on a known run: two ranks save for 0.2 s every 5 steps,
rank 1 exits failed after its 3rd save, the daemon restarts them. The advice in status,
the metrics, the events, the run report and the restarted rank's own question must be
``Ts + sqrt(2 (Tf + Tr) Ts + Ts^2)`` on the figures the event log shows."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.core.checkpoint_interval import optimal_interval
from tests.support import RANKS, Daemon, wait_until

ADVISED = str(RANKS / "advised.py")
SAVE_TIME = 0.2
Start = Callable[..., Daemon]


def _status(pid: int, *, text: bool = False) -> Any:
    argv = [sys.executable, "-m", "supervisor", "status", "--pid", str(pid), *([] if text else ["--json"])]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    return out if text else json.loads(out)


def _gauges(port: int) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        families = text_string_to_metric_families(response.read().decode())
        return {(s.name, s.labels.get("input", "")): s.value for f in families for s in f.samples}


def _formula(a: dict[str, Any]) -> float:
    return optimal_interval(a["ts"], a["tf"], a["tr"] or 0.0)


def test_the_advice_follows_the_formula_on_the_measured_figures(start: Start, tmp_path: Path) -> None:
    answers, go = tmp_path / "answers.jsonl", tmp_path / "go"
    d = start("--nproc-per-node", "2", "--preload", "none", "--max-restarts", "1", "--metrics-port", "0",
              "--ft-rank-section-timeouts", "checkpointing:none",
              ADVISED, "--steps", "20", "--save-every", "5", "--save-time", str(SAVE_TIME),
              "--fail-after-saves", "3", "--answers", str(answers), "--wait-for", str(go))  # fmt: skip
    port = int(d.wait_event("metrics_serving")[0]["port"])
    d.wait_event("rank_stepping", where=lambda e: e["generation"] == 1, count=2)
    lines = wait_until(lambda: [json.loads(x) for x in answers.read_text().splitlines()]
                       if answers.exists() and answers.read_text().count('"generation": 1') >= 4 else None,
                       30, "rank 0's 4 questions in generation 1")  # fmt: skip

    # the figures, from the event log
    failed = next(e for e in d.events("rank_exited") if e["state"] == "failed")
    assert (failed["generation"], failed["rank"]) == (0, 1)
    steps = d.events("rank_stepping")
    stepping = {g: max(e["t_mono"] for e in steps if e["generation"] == g) for g in (0, 1)}
    tr = stepping[1] - failed["t_mono"]
    trained_0 = failed["t_mono"] - stepping[0]

    def tf_at(t: float) -> float:  # one failure: all the training so far
        return trained_0 + max(0.0, t - stepping[1])

    # before the failure there is nothing to go on, and the rank is told why
    early = [x for x in lines if x["generation"] == 0 and x["save"] < 3]
    assert len(early) == 2
    for x in early:
        assert x["seconds"] is None and x["advice"]["seconds"] is None
        assert "no failure seen yet" in x["advice"]["why"]

    # the restarted rank's question, after its last save
    last = [x for x in lines if x["generation"] == 1][-1]
    a = last["advice"]
    assert (a["failures"], a["recoveries"]) == (1, 1)
    assert SAVE_TIME - 0.05 <= a["ts"] < SAVE_TIME + 0.3  # the daemon times the messages it reads
    assert a["tr"] == pytest.approx(tr, abs=1e-6)
    assert tf_at(last["before"]) - 1e-6 <= a["tf"] <= tf_at(last["after"]) + 1e-6
    assert a["seconds"] == pytest.approx(_formula(a), rel=1e-12)
    assert last["seconds"] == pytest.approx(a["seconds"], rel=0.01)  # asked a moment later

    # status and metrics, while generation 1 waits
    before = time.monotonic()
    s = _status(d.pid)["checkpoint_interval"]
    after = time.monotonic()
    assert s["tr"] == pytest.approx(tr, abs=1e-6) and s["ts"] == pytest.approx(a["ts"], abs=0.05)
    assert tf_at(before) - 1e-6 <= s["tf"] <= tf_at(after) + 1e-6
    assert s["seconds"] == pytest.approx(_formula(s), rel=1e-12)
    assert "checkpoint interval: advised" in _status(d.pid, text=True)
    g = wait_until(lambda: (m := _gauges(port)).get(("ft_supervisor_checkpoint_interval_input_seconds", "tr"))
                   and m, 30, "the advice in the metrics")  # fmt: skip
    ts, tf = (g[("ft_supervisor_checkpoint_interval_input_seconds", k)] for k in ("ts", "tf"))
    assert g[("ft_supervisor_checkpoint_interval_advised_seconds", "")] == pytest.approx(
        optimal_interval(ts, tf, g[("ft_supervisor_checkpoint_interval_input_seconds", "tr")]), rel=1e-9)

    go.touch()
    assert d.wait() == 0, d.story()

    # the events: told at the failure, again once the recovery was measured
    told = d.events("checkpoint_interval_advised")
    assert [(e["failures"], e["recoveries"]) for e in told[:2]] == [(1, 0), (1, 1)]
    assert told[0]["tr"] is None and told[1]["tr"] == pytest.approx(tr, abs=1e-6)
    for e in told:
        assert e["seconds"] == pytest.approx(_formula(e), rel=1e-12)
        assert tf_at(e["t_mono"]) - 0.01 <= e["tf"] <= tf_at(e["t_mono"]) + 1e-6

    # the run report ends with the last advice told
    run_dir = d.run_dir()
    assert run_dir is not None
    out = subprocess.run([sys.executable, "-m", "supervisor", "report", str(run_dir), "--json"],
                         capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    reported = json.loads(out)["checkpoint_interval"]
    assert reported == {k: v for k, v in told[-1].items() if k not in ("event", "run_id")}
    text = subprocess.run([sys.executable, "-m", "supervisor", "report", str(run_dir)],
                          capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    line = f"checkpoint interval: advised {told[-1]['seconds']:.2f} s"
    assert line in text and line in (run_dir / "report.html").read_text()
