"""Stack dumps from a real process: a stopped rank answers, and is left stopped."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.process.stacks import dump_stacks, process_state
from tests.support import wait_until

PROGRAM = (
    "import faulthandler, signal, sys, time\n"
    "faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)\n"
    "def spin():\n"
    "    print('ready', flush=True)\n"
    "    while True:\n"
    "        time.sleep(0.01)\n"
    "spin()\n"
)


@pytest.mark.asyncio
async def test_a_stopped_rank_dumps_its_stacks_and_stays_stopped(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, stderr=err)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: process_state(proc.pid) == "T", 10, "the process to stop")
        stacks = await dump_stacks(proc.pid, signal.SIGUSR1, log, timeout=5.0)
        assert "in spin" in stacks
        # resumed to answer, then stopped again: it must not run on as if nothing happened
        # (a signal is delivered when the process next runs, not as kill() returns)
        wait_until(lambda: process_state(proc.pid) == "T", 10, "the process to stop again")
        # a running one is left running
        proc.send_signal(signal.SIGCONT)
        wait_until(lambda: process_state(proc.pid) != "T", 10, "the process to resume")
        assert "in spin" in await dump_stacks(proc.pid, signal.SIGUSR1, log, timeout=5.0)
        assert process_state(proc.pid) != "T"
    finally:
        proc.kill()
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()
