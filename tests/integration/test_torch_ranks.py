"""The whole daemon with real torch ranks (gloo on CPU), and next to real torchrun."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.cli import main
from supervisor.process.native import FLIGHT_RECORDER
from tests.support import RANKS, TRAIN, Daemon, rank_pids, wait_until

pytestmark = [pytest.mark.torch, pytest.mark.slow]
Start = Callable[..., Daemon]
Capture = pytest.CaptureFixture[str]

# Values that must differ between two runs (ports, run ids, paths), and the one
# we change on purpose: ranks never use an agent store that outlives a generation.
MUST_DIFFER = {
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_USE_AGENT_STORE",
}


def _lines(text: str) -> set[str]:
    """Lines with their digits masked: timestamps, pids and ports differ between runs."""
    return {re.sub(r"\d+", "0", line).strip() for line in text.splitlines() if line.strip()}


def test_ranks_get_the_environment_and_say_what_they_say_under_torchrun(
    start: Start, tmp_path: Path, capsys: Capture
) -> None:
    """One real torchrun run (3 torch imports) serves two comparisons: what its ranks get and
    say against ours, and ``ft-supervisor classify`` on its log, where rank 1 is SIGKILLed
    after the all_reduce (``--sigkilled``: the ranks' argv beyond argv[0] is not compared)."""
    ours, theirs = tmp_path / "ours", tmp_path / "torchrun"
    ours.mkdir()
    theirs.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "OMP_", "TORCH"))}
    torchrun = subprocess.run(
        # torchrun's defaults, as ours runs with its own (a --master-port would change MASTER_ADDR)
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         str(RANKS / "envdump.py"), str(theirs), "--gloo", "--sigkilled"],
        timeout=120, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False,
    )  # fmt: skip
    said = torchrun.stdout
    assert torchrun.returncode == 1, said
    assert "failed (exitcode: -9) local_rank: 1" in said
    d = start("--nproc-per-node", "2", str(RANKS / "envdump.py"), str(ours), "--gloo", env=env)
    assert d.wait() == 0, d.story()
    for rank in (0, 1):
        a = json.loads((theirs / f"rank{rank}.json").read_text())
        b = json.loads((ours / f"rank{rank}.json").read_text())
        env_a, env_b = a.pop("env"), b.pop("env")
        ours_only = {k for k in env_b if k.startswith("FT_SUPERVISOR_")} | FLIGHT_RECORDER
        # always given (nvidia-resiliency-ext's name): a rank's "training finished" has a place
        ours_only.add("FAULT_TOL_FINISHED_FLAG_FILE")
        assert set(env_a) == set(env_b) - ours_only
        differ = {k for k in env_a if env_a[k] != env_b[k]}
        assert differ <= MUST_DIFFER, {k: (env_a[k], env_b[k]) for k in differ - MUST_DIFFER}
        assert env_b["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert a.pop("argv")[0] == b.pop("argv")[0]
        assert a == b  # sys.path[0], __file__, -u, stdin, own session...
    # and no line a rank prints under ft-supervisor that it does not print under torchrun:
    # a deprecation warning for a variable the daemon set, in every rank, every generation
    assert "all_reduce 2" in said
    # torchrun's ranks share its stdout, and a print's text and its newline are two writes:
    # two ranks' lines may come out as one ("rank 0: all_reduce 2rank 1: all_reduce 2")
    masked = re.sub(r"\d+", "0", said)
    run_dir = d.run_dir()
    assert run_dir is not None
    for rank in (0, 1):
        for stream in ("stdout.log", "stderr.log"):
            text = (run_dir / "gen_0" / f"local_rank_{rank}" / stream).read_text()
            assert all(line in masked for line in _lines(text)), (stream, text, said)
    _classify_names_the_rank_torchrun_reports(said, tmp_path, capsys)


def _classify_names_the_rank_torchrun_reports(said: str, tmp_path: Path, capsys: Capture) -> None:
    """``ft-supervisor classify`` on a real torchrun log (tests/component/test_postmortem.py's
    other cases are written logs, and run the command in its own interpreter, as an SRE
    does; here its main, in this process): the rank torchrun reports, named as the
    launcher's log or found to be one."""

    def _classify(*args: str) -> dict[str, Any]:
        capsys.readouterr()
        assert main(["classify", "--json", *args]) == 0, capsys.readouterr().err
        out: dict[str, Any] = json.loads(capsys.readouterr().out)
        return out

    log = tmp_path / "torchrun.log"
    log.write_text(said)
    for args in (("--agent-log", str(log)), (str(log),)):
        out = _classify(*args)
        c = out["classification"]
        assert (c["rule"], c["rank"], c["wrapped_by"]) == ("P6", 1, ["D4"]), out
        assert any("Signal 9 (SIGKILL) received by PID" in line for line in c["lines"])
    # the exit torchrun reports is rank 1's exit status: without the text rule, the signal rule sees it
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nid = "P6"\ncategory = "oom"\nany = ["^no such line$"]\n')
    out = _classify("--rules", str(rules), "--agent-log", str(log))
    assert (out["classification"]["rule"], out["classification"]["rank"]) == ("X-SIGKILL", 1)


def test_crash_restart_resume_finish_and_the_daemon_never_loads_torch(start: Start, tmp_path: Path) -> None:
    # the daemon starts torch ranks from its fork server and a preloaded standby generation,
    # and never maps libtorch itself (one restart, all it needs: a restart left over would
    # have it preload standbys that the last generation never uses). The default preload,
    # without torch._dynamo: preloaded, it makes gloo jobs deadlock at exit
    # (docs/guides/standbys.md), a flaky test; that the default's resolution does not import
    # torch in the daemon: tests/unit/test_cli.py
    snapshot = tmp_path / "snapshot.pt"
    d = start(
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        str(TRAIN),
        "--steps",
        "30",
        "--step-time",
        "0.05",
        "--save-every",
        "10",
        # past the snapshot at step 10: rank 0 wrote it before step 10's all_reduce
        "--crash-at-step",
        "12",
        "--snapshot",
        str(snapshot),
        "--plain",  # DDP's set-up imports torch._dynamo, 2 CPU-s a rank a generation: not the point here
    )
    # generation 1 has 20 steps of at least 50 ms left after it says it resumed: its ranks
    # are alive a while
    wait_until(lambda: "[rank 0] resuming from snapshot at step 10" in d.stdout(), 120, "generation 1")
    maps = Path(f"/proc/{d.pid}/maps").read_text()
    assert "libtorch" not in maps
    rank_maps = Path(f"/proc/{rank_pids(d, 1)[0]}/maps").read_text()
    assert "libtorch" in rank_maps  # the check can fail: the ranks do load it
    assert d.wait(timeout=120) == 0, d.story()
    out = d.stdout()
    assert "[rank 1] injecting a fault at step 12 (raise)" in out
    assert "[rank 0] training finished: 30 steps" in out
    decision = d.events("decision")[0]
    assert "RuntimeError: injected fault at step 12 on rank 1" in decision["detail"]


def test_a_failure_prints_the_root_cause_from_the_error_file(start: Start) -> None:
    """torch's own ``@record`` writes the error file the root cause is printed from. The
    budget running out over it, on the same file format, is tests/fast/test_classification.py's.
    ``--plain``: DDP is not the point (its set-up imports torch._dynamo, ~2 CPU-s a rank). Rank
    0 then waits in a plain all_reduce, which fails the moment rank 1's process group goes:
    train.py keeps it until rank 1 exits, after @record wrote its error file, so the earliest
    error file is rank 1's on a loaded machine too (destroyed in a ``finally``, it was not)."""
    d = start(
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "0",
        str(TRAIN),
        "--steps",
        "20",
        "--step-time",
        "0.01",
        "--crash-at-step",
        "3",
        "--crash-generations",
        "all",
        "--plain",
    )
    assert d.wait(timeout=120) == 2  # a Python error: deterministic, abort
    err = d.stderr()
    assert "root cause: rank 1 (local rank 1" in err
    assert "RuntimeError: injected fault at step 3 on rank 1" in err
    assert "error file:" in err  # the @record traceback, not just an exit code
