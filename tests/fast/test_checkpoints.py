"""Checkpoints, driven in-process on virtual time: the sync of LOCAL to DEST through the
daemon's loop (the last sync after the ranks are gone, retention), and the advised
checkpoint interval ``Ts + sqrt(2 (Tf + Tr) Ts + Ts^2)`` on figures exact on the
daemon's clock. The sync's files and mtimes are real (the settle time is judged on
real time: the integration tests keep that); the periods are virtual."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.checkpoints.sync import CheckpointSync
from supervisor.checkpoints.threads import DaemonThreads
from supervisor.config.checkpoints import CheckpointConfig
from supervisor.core.checkpoint_interval import optimal_interval
from supervisor.core.types import EventSink
from supervisor.runtime.lifecycle import daemon as daemon_module
from supervisor.runtime.lifecycle import signals
from supervisor.runtime.lifecycle.daemon import Supervisor
from tests.fast.fakes import Rank
from tests.fast.harness import Watcher, supervise

ONE = ("--nproc-per-node", "1")


@pytest.fixture(autouse=True)
def idle_sync_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync's worker threads idle between calls for the whole run: to the virtual
    loop they are resident (a name it knows), and the work in them is still waited for
    (every call goes through ``loop.run_in_executor``)."""

    def made(cfg: CheckpointConfig | None, events: EventSink) -> CheckpointSync:
        return CheckpointSync(cfg, events, executor=DaemonThreads(name="ThreadPoolExecutor-ft-checkpoints"))

    monkeypatch.setattr(daemon_module, "CheckpointSync", made)


def sync_args(local: Path, dest: Path, *extra: str) -> tuple[str, ...]:
    return ("--checkpoint-path", str(local), "--checkpoint-url", str(dest), *extra)


def committed(dest: Path) -> set[str]:
    """The entries under a real name at DEST, each checked complete (it parses, whole)."""
    names = {p.name for p in dest.iterdir() if not p.name.startswith(".ft-")}
    for name in names:
        assert json.loads((dest / name).read_text())["step"] == int(name[5:11]), name
    assert set(json.loads((dest / ".ft-checkpoints.json").read_text())["entries"]) <= names
    return names


def save(local: Path, step: int, settled: bool = True) -> str:
    """tests/fixtures/ranks/checkpointing.py's save; ``settled``: last written a while ago
    (real time), each step a second after the one before."""
    local.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}.json"
    path = local / name
    path.write_text(json.dumps({"step": step, "pad": "x" * 4096}))
    if settled:
        at = time.time_ns() - 3600 * 10**9 + step * 10**9
        os.utime(path, ns=(at, at))
    return name


def checkpointing(local: Path, steps: int | None, *, wait_dest: Path | None = None,
                  save_on_term: bool = False, settled: bool = True):  # fmt: skip
    """tests/fixtures/ranks/checkpointing.py: a checkpoint each 0.05 s step; ``wait_dest``:
    until DEST has it; ``save_on_term``: SIGTERM saves one more, then it exits 0."""

    async def script(r: Rank) -> int | None:
        step = 0

        def on_signal(signum: int) -> None:  # the rank's SIGTERM handler
            if signum == signal.SIGTERM and r.proc.returncode is None:
                r.log(f"saved {save(local, step, settled)} on SIGTERM", stream="stdout")
                r._end(0)
            else:
                Rank.signal(r, signum)

        if save_on_term:
            r.signal = on_signal  # type: ignore[method-assign]
        r.hello()
        while steps is None or step < steps:
            await r.sleep(0.05)
            name = save(local, step, settled)
            while wait_dest is not None and not (wait_dest / name).exists():
                await r.sleep(0.02)
            step += 1
        return 0

    return script


def test_a_normal_end_syncs_the_last_checkpoint(tmp_path: Path) -> None:
    local, dest = tmp_path / "local", tmp_path / "dest"
    args = sync_args(local, dest, "--checkpoint-frequency", "1h", "--checkpoint-settle", "60")
    run = supervise(tmp_path, checkpointing(local, 2), *ONE, *args)
    assert run.code == 0, run.story()
    assert [e["reason"] for e in run.named("checkpoint_restore_skipped")] == ["dest_empty"]
    synced = run.named("checkpoint_synced")
    assert [(e["entries"], e["final"]) for e in synced] == [(["step_000001.json", "step_000000.json"], True)]
    assert sorted(committed(dest)) == ["step_000000.json", "step_000001.json"]
    # the copy-back was over before the ranks started; the last sync after they were gone
    names = [e["event"] for e in run.events]
    assert names.index("checkpoint_restore_skipped") < names.index("generation_started")
    assert names.index("generation_ended") < names.index("checkpoint_synced")


def test_sigterm_ends_with_a_last_sync_after_the_ranks_are_gone(tmp_path: Path) -> None:
    local, dest = tmp_path / "local", tmp_path / "dest"

    async def stop_after_three(daemon: Supervisor, seen: Watcher) -> None:
        await seen.first("generation_started")
        while len(list(local.glob("step_*.json"))) < 3:
            await daemon.clock.sleep(0.01)
        daemon.commands.queue.put_nowait(signals.Stop(signal.SIGTERM))

    # a settle time no checkpoint reaches while ranks run: only the last sync sends anything
    run = supervise(tmp_path, checkpointing(local, None, save_on_term=True, settled=False), *ONE,
                    *sync_args(local, dest, "--checkpoint-frequency", "1h", "--checkpoint-settle", "60"),
                    operator=stop_after_three)  # fmt: skip
    assert run.code == 128 + signal.SIGTERM, run.story()
    newest = max(p.name for p in local.glob("step_*.json"))
    (rank,) = run.ranks.spawned
    assert f"saved {newest} on SIGTERM" in rank.files.stdout.read_text()
    assert rank.proc.returncode == 0  # it saved and exited of its own
    final = run.one("checkpoint_synced")
    assert final["final"] and newest in final["entries"]
    assert sorted(committed(dest)) == sorted(p.name for p in local.glob("step_*.json"))
    # in order: the stop, the rank gone, then the last sync (written unsettled: no settle time)
    names = [e["event"] for e in run.events]
    assert names.index("rank_exited") < names.index("generation_ended") < names.index("checkpoint_synced")


def test_retention_keeps_the_k_newest_at_dest_and_all_in_local(tmp_path: Path) -> None:
    local, dest = tmp_path / "local", tmp_path / "dest"
    args = sync_args(local, dest, "--checkpoint-frequency", "0.1", "--checkpoint-settle", "0.05",
                     "--checkpoint-keep", "2")  # fmt: skip
    run = supervise(tmp_path, checkpointing(local, 5, wait_dest=dest), *ONE, *args)
    assert run.code == 0, run.story()
    assert sorted(committed(dest)) == ["step_000003.json", "step_000004.json"]
    pruned = [n for e in run.named("checkpoint_pruned") for n in e["entries"]]
    assert sorted(pruned) == ["step_000000.json", "step_000001.json", "step_000002.json"]
    assert all(e["keep"] == 2 for e in run.named("checkpoint_pruned"))
    assert len(list(local.glob("step_*.json"))) == 5  # LOCAL is never pruned
    # each sent by a periodic sync as it came: nothing was left for the last one
    assert [e["entries"] for e in run.named("checkpoint_synced") if e["final"]] == [[]]


SAVE_TIME = 0.2


def _formula(a: dict[str, Any]) -> float:
    return optimal_interval(a["ts"], a["tf"], a["tr"] or 0.0)


def test_the_advice_follows_the_formula_on_the_measured_figures(tmp_path: Path) -> None:
    """Two ranks save for 0.2 s every 5 steps; rank 1 exits failed after its 3rd save;
    the daemon restarts them. Rank 0 asks for the advice after each save."""
    answers: list[dict[str, Any]] = []
    asked: dict[str, dict[str, Any]] = {}
    status: list[dict[str, Any]] = []

    async def operator(daemon: Supervisor, seen: Watcher) -> None:
        ack = daemon.monitor.inbox.ack

        def answered(request_id: str | None, **data: object) -> None:
            if request_id is not None:
                asked[request_id] = dict(data)
            ack(request_id, **data)

        daemon.monitor.inbox.ack = answered  # type: ignore[method-assign]
        await seen.first("rank_stepping", generation=1, rank=0)
        await seen.first("rank_stepping", generation=1, rank=1)
        await daemon.clock.sleep(0.3)
        status.append({**daemon.commands.control("status")["checkpoint_interval"],
                       "at": daemon.clock.monotonic()})  # fmt: skip

    async def advised(r: Rank) -> int | None:
        r.hello()
        saves = 0
        for step in range(20):
            await r.sleep(0.02)
            r.send("iteration", iteration=step)
            if (step + 1) % 5:
                continue
            r.send("section", op="open", name="checkpointing", iteration=step)
            await r.sleep(SAVE_TIME)
            r.send("section", op="close", name="checkpointing", iteration=step)
            r.send("checkpoint", event="saved")
            saves += 1
            if r.rank == 1 and r.generation == 0 and saves == 3:
                return 1
            if r.rank == 0:
                before, request = r.ranks.clock.monotonic(), f"q{r.generation}.{saves}"
                r.send("checkpoint_interval", id=request)
                await r.sleep(0.001)
                answers.append({"generation": r.generation, "save": saves, "advice": asked.get(request),
                                "before": before, "after": r.ranks.clock.monotonic()})  # fmt: skip
        return 0

    options = ("--max-restarts", "1", "--ft-rank-section-timeouts", "checkpointing:none")
    run = supervise(tmp_path, advised, *options, operator=operator)
    assert run.code == 0, run.story()
    # the figures, from the event log
    failed = next(e for e in run.named("rank_exited") if e["state"] == "failed")
    assert (failed["generation"], failed["rank"]) == (0, 1)
    steps = run.named("rank_stepping")
    stepping = {g: max(e["t_mono"] for e in steps if e["generation"] == g) for g in (0, 1)}
    tr = stepping[1] - failed["t_mono"]
    trained_0 = failed["t_mono"] - stepping[0]

    def tf_at(t: float) -> float:  # one failure: all the training so far
        return trained_0 + max(0.0, t - stepping[1])

    # before the failure there is nothing to go on, and the rank is told why
    early = [x for x in answers if x["generation"] == 0 and x["save"] < 3]
    assert len(early) == 2
    for x in early:
        assert x["advice"]["seconds"] is None and "no failure seen yet" in x["advice"]["why"]
    # the restarted rank's question, after its last save: exact on the daemon's clock
    last = [x for x in answers if x["generation"] == 1][-1]
    a = last["advice"]
    assert (a["failures"], a["recoveries"]) == (1, 1)
    assert a["ts"] == pytest.approx(SAVE_TIME, abs=1e-6)  # the daemon times the messages it reads
    assert a["tr"] == pytest.approx(tr, abs=1e-6)
    assert tf_at(last["before"]) - 1e-6 <= a["tf"] <= tf_at(last["after"]) + 1e-6
    assert a["seconds"] == pytest.approx(_formula(a), rel=1e-12)
    # status, while generation 1 runs
    (s,) = status
    assert s["tr"] == pytest.approx(tr, abs=1e-6) and s["ts"] == pytest.approx(SAVE_TIME, abs=1e-6)
    assert s["tf"] == pytest.approx(tf_at(s["at"]), abs=1e-6)
    assert s["seconds"] == pytest.approx(_formula(s), rel=1e-12)
    # the events: told at the failure, again once the recovery was measured
    told = run.named("checkpoint_interval_advised")
    assert [(e["failures"], e["recoveries"]) for e in told[:2]] == [(1, 0), (1, 1)]
    assert told[0]["tr"] is None and told[1]["tr"] == pytest.approx(tr, abs=1e-6)
    for e in told:
        assert e["seconds"] == pytest.approx(_formula(e), rel=1e-12)
        assert e["tf"] == pytest.approx(tf_at(e["t_mono"]), abs=1e-6)
