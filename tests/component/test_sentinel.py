"""The sentinel sweeps a run's processes when its pipe closes (the daemon died)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

from supervisor.core.topology import ENV_TOKEN, generation_token, token_entry
from supervisor.process.orphans import SENTINEL
from supervisor.process.sentinel import pids_with_env
from tests.support import alive, wait_until

SLEEP = [sys.executable, "-c", "import time; time.sleep(3600)"]


def _run_process(token: str, generation: int, *, new_session: bool) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env[ENV_TOKEN] = generation_token(token, generation)
    return subprocess.Popen(SLEEP, env=env, start_new_session=new_session)


def _ignores(pid: int, signum: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(ln for ln in status.splitlines() if ln.startswith("SigIgn:")).split()[1], 16)
    return bool(mask & (1 << (signum - 1)))


def test_sweeps_every_generation_of_its_run_and_nothing_else(tmp_path: Path) -> None:
    ours = [_run_process("runA", 0, new_session=True), _run_process("runA", 12, new_session=False)]
    other = _run_process("runAB", 1, new_session=True)  # a prefix of ours must not match
    sentinel = subprocess.Popen(
        [sys.executable, "-P", SENTINEL, token_entry("runA").decode()],
        stdin=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        wait_until(lambda: len(pids_with_env(token_entry("runA"), prefix=True)) == 2, 10, "scan")
        wait_until(lambda: _ignores(sentinel.pid, signal.SIGTERM), 10, "the sentinel's handlers")
        sentinel.send_signal(signal.SIGTERM)  # ignored: the sentinel outlives signals
        assert sentinel.stdin is not None
        sentinel.stdin.close()  # what the kernel does when the daemon dies
        assert sentinel.wait(30) == 0
        for p in ours:
            assert p.wait(10) == -signal.SIGKILL
        assert alive(other.pid)
    finally:
        for p in [*ours, other, sentinel]:
            if p.poll() is None:
                p.kill()
                p.wait()
