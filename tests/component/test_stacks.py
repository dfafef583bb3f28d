"""Stack dumps from a real process: a running rank answers; a stopped one is not woken to."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.process.stacks import dump_stacks
from supervisor.process.terminate import process_state
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
async def test_a_stopped_rank_is_not_woken_for_its_stacks_and_a_running_one_answers(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, stderr=err)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: process_state(proc.pid) == "T", 10, "the process to stop")
        # woken to answer, it would run on while it is judged (its collective completes, its
        # peers go on): it is left as it is, and nothing is sent that it would answer later
        assert await dump_stacks(proc.pid, signal.SIGUSR1, log, timeout=0.5) == ""
        assert process_state(proc.pid) == "T"
        proc.send_signal(signal.SIGCONT)
        wait_until(lambda: process_state(proc.pid) != "T", 10, "the process to resume")
        assert "in spin" in await dump_stacks(proc.pid, signal.SIGUSR1, log, timeout=5.0)
        assert log.read_text().count("in spin") == 1  # no dump was left pending while it was stopped
        assert process_state(proc.pid) != "T"
    finally:
        proc.kill()
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()
