"""py-spy as the bundle runs it: bounded in time and size, and a reason, never an
error, when it is missing or fails."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.process import native
from supervisor.process.native import native_stacks, py_spy
from supervisor.process.terminate import process_state
from tests.support import wait_until


def _exe(tmp_path: Path, body: str) -> str:
    path = tmp_path / "py-spy"
    path.write_text(f"#!{sys.executable}\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.asyncio
async def test_a_py_spy_that_does_not_answer_is_given_up_within_the_bound(tmp_path: Path) -> None:
    began = time.monotonic()
    got = await native_stacks(os.getpid(), 0.5, _exe(tmp_path, "import time; time.sleep(60)"))
    assert got.text == "" and got.error == "py-spy did not answer within 0.5 s"
    assert time.monotonic() - began < 5


@pytest.mark.asyncio
async def test_a_failing_or_missing_py_spy_is_a_reason(tmp_path: Path) -> None:
    failed = await native_stacks(1, 5, _exe(tmp_path, "import sys; sys.exit('Error: Permission denied')"))
    assert failed.error == "py-spy failed: Error: Permission denied"
    missing = await native_stacks(1, 5, str(tmp_path / "nowhere"))
    assert missing.error is not None and missing.error.startswith("cannot run py-spy")


@pytest.mark.asyncio
async def test_a_flood_from_py_spy_is_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "NATIVE_MAX", 64 * 1024)
    flood = "import sys\nwhile True: sys.stdout.write('x' * 65536)"
    got = await native_stacks(os.getpid(), 10, _exe(tmp_path, flood))
    assert got.error is None and len(got.text) == 64 * 1024


@pytest.mark.asyncio
@pytest.mark.skipif(py_spy() is None, reason="py-spy is not installed (the diagnostics extra)")
async def test_the_native_stacks_of_a_live_process() -> None:
    code = "import time\ndef napping(): time.sleep(60)\nnapping()"
    sleeper = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while True:  # until the interpreter has reached the function
            got = await native_stacks(sleeper.pid, 10)
            if "napping" in got.text or time.monotonic() > deadline:
                break
        assert "napping" in got.text and "(libc" in got.text, got
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.asyncio
@pytest.mark.skipif(py_spy() is None, reason="py-spy is not installed (the diagnostics extra)")
async def test_a_stopped_process_gives_its_python_stacks_and_stays_stopped() -> None:
    code = "import time\ndef frozen_here(): time.sleep(60)\nprint('in', flush=True)\nfrozen_here()"
    sleeper = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline() == b"in\n"
        sleeper.send_signal(signal.SIGSTOP)
        wait_until(lambda: process_state(sleeper.pid) == "T", 10, "the process to stop")
        got = await native_stacks(sleeper.pid, 10, stopped=True)
        assert "frozen_here" in got.text, got
        # read from its memory: never paused through ptrace (a detach resumes it at once), never resumed
        assert process_state(sleeper.pid) == "T"
    finally:
        sleeper.kill()
        sleeper.wait()
        assert sleeper.stdout is not None
        sleeper.stdout.close()


@pytest.mark.parametrize(
    ("torch_version", "buffer", "dump"),
    [
        ("2.13.0+cpu", native.NEW_BUFFER_ENV, native.NEW_DUMP_ENV),
        ("2.9.1", native.NEW_BUFFER_ENV, native.NEW_DUMP_ENV),
        ("2.8.0", native.BUFFER_ENV, native.DUMP_ENV),
        ("2.1.2", native.BUFFER_ENV, native.DUMP_ENV),
        (None, native.BUFFER_ENV, native.DUMP_ENV),  # unknown: the names every torch reads
        ("nightly", native.BUFFER_ENV, native.DUMP_ENV),
    ],
)
def test_the_flight_recorder_is_set_under_the_names_the_ranks_torch_reads(
    tmp_path: Path, torch_version: str | None, buffer: str, dump: str
) -> None:
    env = native.flight_recorder_env({}, tmp_path, torch_version)
    assert env == {
        buffer: native.BUFFER_ENTRIES,
        dump: str(tmp_path / "nccl_trace_rank_"),
        native.PIPE_ENV: str(tmp_path / "nccl_pipe_rank_"),
    }


@pytest.mark.parametrize("given", [native.BUFFER_ENV, native.NEW_BUFFER_ENV])
def test_a_users_flight_recorder_setting_under_either_name_stands(tmp_path: Path, given: str) -> None:
    for version in ("2.13.0", "2.4.0"):
        env = native.flight_recorder_env({given: "77"}, tmp_path, version)
        assert not {native.BUFFER_ENV, native.NEW_BUFFER_ENV} & env.keys(), (version, env)
