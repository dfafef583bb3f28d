"""The advised checkpoint interval through a real daemon's plumbing, once: two ranks save
every 5 steps, rank 1 exits failed after its first save, the daemon restarts them. The
advice the restarted rank asks for, status, the metrics and the run report must agree
with ``Ts + sqrt(2 (Tf + Tr) Ts + Ts^2)`` on their own figures. That Ts, Tf and Tr are
what the event log shows, exactly, and when the advice is told, is in
tests/fast/test_checkpoints.py (virtual time)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.cli import main
from supervisor.core.checkpoint_interval import optimal_interval
from tests.support import RANKS, Daemon, wait_until

ADVISED = str(RANKS / "advised.py")
Start = Callable[..., Daemon]


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def _gauges(port: int) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        families = text_string_to_metric_families(response.read().decode())
        return {(s.name, s.labels.get("input", "")): s.value for f in families for s in f.samples}


def _formula(a: dict[str, Any]) -> float:
    return optimal_interval(a["ts"], a["tf"], a["tr"] or 0.0)


def test_the_advice_reaches_the_rank_status_metrics_and_report(
    start: Start, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answers, go = tmp_path / "answers.jsonl", tmp_path / "go"
    d = start("--nproc-per-node", "2", "--preload", "none", "--max-restarts", "1", "--metrics-port", "0",
              "--ft-rank-section-timeouts", "checkpointing:none",
              ADVISED, "--steps", "10", "--save-every", "5", "--save-time", "0.1",
              "--fail-after-saves", "1", "--answers", str(answers), "--wait-for", str(go))  # fmt: skip
    port = int(d.wait_event("metrics_serving")[0]["port"])
    lines = wait_until(lambda: [json.loads(x) for x in answers.read_text().splitlines()]
                       if answers.exists() and answers.read_text().count('"generation": 1') >= 2 else None,
                       30, "rank 0's 2 questions in generation 1")  # fmt: skip

    # the restarted rank's question, after its last save: the client's two ways to ask agree
    last = [x for x in lines if x["generation"] == 1][-1]
    a = last["advice"]
    assert (a["failures"], a["recoveries"]) == (1, 1)
    assert a["seconds"] == pytest.approx(_formula(a), rel=1e-12)
    assert last["seconds"] == pytest.approx(a["seconds"], rel=0.01)  # asked a moment later

    # status and metrics, while generation 1 waits
    s = json.loads(_cli(capsys, "status", "--pid", str(d.pid), "--json"))["checkpoint_interval"]
    assert s["tr"] == a["tr"] and s["ts"] == pytest.approx(a["ts"], abs=0.05) and s["tf"] >= a["tf"]
    assert s["seconds"] == pytest.approx(_formula(s), rel=1e-12)
    assert "checkpoint interval: advised" in _cli(capsys, "status", "--pid", str(d.pid))
    g = wait_until(lambda: (m := _gauges(port)).get(("ft_supervisor_checkpoint_interval_input_seconds", "tr"))
                   and m, 30, "the advice in the metrics")  # fmt: skip
    ts, tf = (g[("ft_supervisor_checkpoint_interval_input_seconds", k)] for k in ("ts", "tf"))
    assert g[("ft_supervisor_checkpoint_interval_advised_seconds", "")] == pytest.approx(
        optimal_interval(ts, tf, g[("ft_supervisor_checkpoint_interval_input_seconds", "tr")]), rel=1e-9
    )

    go.touch()
    assert d.wait() == 0, d.story()

    # the run report ends with the last advice told
    told = d.events("checkpoint_interval_advised")
    run_dir = d.run_dir()
    assert run_dir is not None
    reported = json.loads(_cli(capsys, "report", str(run_dir), "--json"))["checkpoint_interval"]
    assert reported == {k: v for k, v in told[-1].items() if k not in ("event", "run_id")}
    text = _cli(capsys, "report", str(run_dir))
    line = f"checkpoint interval: advised {told[-1]['seconds']:.2f} s"
    assert line in text and line in (run_dir / "report.html").read_text()
