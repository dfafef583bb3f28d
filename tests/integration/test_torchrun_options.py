"""One real job with as many of torchrun's options at once as can coexist: it runs,
and the settings_ignored event names exactly the options that have no effect here."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.config import torchrun
from supervisor.config.run import count_gpus
from tests.support import Daemon

Start = Callable[..., Daemon]

SCRIPT = """\
import os, sys
r = os.environ["RANK"]
print(f"step 1 rank {r} local {os.environ['LOCAL_RANK']}")
print(f"loss 0.5 rank {r}")
print(f"loss,x 0.4 rank {r}")
print(f"warn rank {r}", file=sys.stderr)
print(f"quiet rank {r}", file=sys.stderr)
"""


@pytest.mark.slow
def test_a_job_with_every_torchrun_option_that_can_coexist(start: Start, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    d = start(
        "--preload", "none",
        "--nnodes", "1", "--nproc-per-node", "2", "--node-rank", "0", "--rdzv-backend", "c10d",
        "--rdzv-conf", "join_timeout=60", "--max-restarts", "1", "--monitor-interval", "0.5",
        "--start-method", "forkserver", "--event-log-handler", "console", "--role", "trainer",
        "--run-path", "--no-python", "-m", "-r", "3", "-t", "0:3,1:1", "--local-ranks-filter", "0,1",
        "--duplicate-stdout-filters", "loss,,x,step", "--duplicate_stderr_filters", "warn",
        "--master-addr", "127.0.0.1", "--local-addr", "127.0.0.1", "--logs-specs", "default",
        "--numa-binding", "node", "--signals-to-handle", "SIGTERM,SIGINT,SIGUSR1",
        "--shutdown-timeout", "5", "--virtual-local-rank",
        str(script),
    )  # fmt: skip
    assert d.wait(60) == 0, d.story()
    expected = {"--monitor-interval 0.5", "--start-method forkserver", "--event-log-handler console",
                "--logs-specs default"}  # fmt: skip
    if torchrun.numa_nodes() < 2 or count_gpus(os.environ) == 0:
        expected.add("--numa-binding node")
    (event,) = d.events("settings_ignored")
    assert {o["option"] for o in event["settings"]} == expected
    assert all(o["why"] for o in event["settings"])
    assert "settings_ignored" in d.stderr() and "--logs-specs default" in d.stderr()  # on the console
    # --run-path over --no-python and -m; LOCAL_RANK 0 for both (--virtual-local-rank)
    assert "[rank 1] step 1 rank 1 local 0" in d.stdout()
    run_dir = d.run_dir()
    assert run_dir is not None
    gen = run_dir / "gen_0"
    # the lines torchrun would duplicate: a needle ("loss,x" or "step") in a teed stream
    copied = sorted((gen / "filtered_stdout.log").read_text().splitlines())
    assert copied == [f"[rank {r}] {line} rank {r}{tail}" for r in (0, 1)
                      for line, tail in (("loss,x 0.4", ""), ("step 1", " local 0"))]  # fmt: skip
    assert (gen / "filtered_stderr.log").read_text() == "[rank 0] warn rank 0\n"  # rank 1 tees stdout only
