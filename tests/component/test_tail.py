import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.core.notable import nccl_tears_down
from supervisor.log import STDERR, STDOUT, Console
from supervisor.process.evidence import log_tail
from supervisor.process.tail import MAX_LINE, LogFollower
from tests.support import wait_until


class Captured(Console):
    """A console that keeps what it is given (the writer thread is not started)."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[tuple[int, bytes]] = []

    def write(self, stream: int, data: bytes) -> None:
        self.written.append((stream, data))

    def text(self, stream: int) -> bytes:
        return b"".join(d for s, d in self.written if s == stream)


def test_lines_get_the_rank_prefix_and_partial_lines_wait(tmp_path: Path) -> None:
    out, err = tmp_path / "out", tmp_path / "err"
    console = Captured()
    follower = LogFollower(console)
    follower.follow(3, out, STDOUT)
    follower.follow(3, err, STDERR)
    follower.poll()  # files do not exist yet: nothing happens
    with out.open("ab") as o, err.open("ab") as e:
        o.write(b"one\ntw")
        o.flush()
        e.write(b"bad\n")
        e.flush()
        follower.poll()
        assert console.text(STDOUT) == b"[rank 3] one\n"
        assert console.text(STDERR) == b"[rank 3] bad\n"
        o.write(b"o\nthree")
        o.flush()
    follower.finish()
    assert console.text(STDOUT) == b"[rank 3] one\n[rank 3] two\n[rank 3] three\n"


def test_a_runaway_line_is_cut(tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.write_bytes(b"x" * (MAX_LINE + 10))
    console = Captured()
    follower = LogFollower(console)
    follower.follow(0, path, STDOUT)
    follower.poll()
    assert len(console.written) == 1
    follower.finish()


def test_console_drops_instead_of_blocking(tmp_path: Path) -> None:
    read_fd, write_fd = os.pipe()  # nobody reads: a stuck terminal
    console = Console(maxsize=4)
    saved = os.dup(1)
    os.dup2(write_fd, 1)
    try:
        console.start()
        started = time.monotonic()
        for _ in range(10_000):
            console.write(STDOUT, b"y" * 1024 + b"\n")
        assert time.monotonic() - started < 30  # writes never waited for the pipe
        assert console.dropped > 0
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(read_fd)
        os.close(write_fd)
        console.close(timeout=1)


_INTERLEAVED = """
import sys
from supervisor.log import STDERR, STDOUT, Console
console = Console()
console.write(STDOUT, b"last line of a rank\\n")   # queued behind it: the daemon's event
console.write(STDERR, b"rank_exited rank=0\\n")
console.start()
sys.stdin.read()   # stay alive, writing nothing more, until the test lets go
console.close()
"""


def test_every_stream_written_is_flushed_when_the_queue_runs_dry(tmp_path: Path) -> None:
    out, err = tmp_path / "out", tmp_path / "err"
    # files, and no PYTHONUNBUFFERED: block-buffered, as the daemon's output is under CI
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen([sys.executable, "-c", _INTERLEAVED],
                                stdin=subprocess.PIPE, stdout=o, stderr=e, env=env)  # fmt: skip
    try:
        wait_until(err.read_bytes, 10, "the stderr line")
        # the stdout line was written first: it must be out too, not held in a buffer
        wait_until(lambda: out.read_bytes() == b"last line of a rank\n", 10, "the stdout line")
    finally:
        proc.communicate(b"", timeout=10)


def test_what_a_rank_leaves_behind_writes_after_it_exits_is_kept_apart(tmp_path: Path) -> None:
    err = tmp_path / "err"
    follower = LogFollower(Captured())
    follower.follow(1, err, STDERR, show=False)
    with err.open("ab") as e:
        e.write(b"RuntimeError: its own last words\n")
        e.flush()
        offsets = follower.exited(1)  # the rank's process is gone
        assert offsets == {err: len(b"RuntimeError: its own last words\n")}
        e.write(b"ConnectionResetError: [Errno 104] Connection reset by peer\n")  # an orphaned worker
        e.flush()
    notable = follower.finish()
    assert notable[1] == ("RuntimeError: its own last words",)
    assert follower.after_exit[1] == ("ConnectionResetError: [Errno 104] Connection reset by peer",)


@pytest.mark.asyncio
async def test_a_log_tail_between_offsets(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(b"a\nb\nc\nd\n")
    assert await log_tail(log, end=4) == ("a", "b")
    assert await log_tail(log, start=4) == ("c", "d")
    assert await log_tail(log, max_bytes=3, start=2) == ("d",)  # the cut line is dropped


FAILURES = Path(__file__).resolve().parent.parent / "fixtures" / "failures"
CAPTURED = FAILURES / "n1_watchdog_timeout_captured_h200.log"


@pytest.mark.parametrize(("handling", "says"), [("1", True), ("3", True), ("0", False), ("2", False)])
def test_the_watchdog_s_timeout_says_the_rank_goes_down_only_where_torch_takes_it_down(
    tmp_path: Path, handling: str, says: bool
) -> None:
    """With TORCH_NCCL_ASYNC_ERROR_HANDLING 0 or 2 the process lives on after a watchdog
    timeout (a program may recover in place): the line is evidence, not a failure report.
    torch's own 'taking the entire process down' is one whatever the mode."""
    log = tmp_path / "err"
    log.write_bytes(CAPTURED.read_bytes())  # the H200's watchdog timeout, byte for byte
    tears_down = nccl_tears_down({"TORCH_NCCL_ASYNC_ERROR_HANDLING": handling})
    follower = LogFollower(Captured(), tears_down=tears_down)
    follower.follow(0, log, STDERR)
    follower.poll()
    said = follower.going_down(0)
    assert (said is not None) == says
    assert said is None or "Watchdog caught collective operation timeout" in said
    with log.open("a") as f:
        f.write("[rank0]:[E1126 ProcessGroupNCCL.cpp:1] To avoid data inconsistency, "
                "we are taking the entire process down.\n")  # fmt: skip
    follower.poll()
    assert follower.going_down(0) is not None
    assert nccl_tears_down({}) and follower.finish()[0]
