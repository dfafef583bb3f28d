"""Helpers shared by the tests: deadlines, a daemon under test, process checks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RANKS = REPO / "tests" / "fixtures" / "ranks"
TRAIN = REPO / "scripts" / "train.py"
LEAK_KEY = "FT_TEST_LEAK_TOKEN"


class Timeout(AssertionError):
    pass


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise Timeout(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


class Daemon:
    """``ft-supervisor run`` in a subprocess, observed through its files."""

    def __init__(
        self, tmp: Path, args: Iterable[str], env: dict[str, str] | None = None, run_id: str = "t"
    ) -> None:
        self.tmp = tmp
        self.log_dir = tmp / "logs"
        self.run_id = run_id
        self.stdout_path = tmp / "daemon.stdout"
        self.stderr_path = tmp / "daemon.stderr"
        argv = [
            sys.executable,
            "-m",
            "supervisor",
            "run",
            "--log-dir",
            str(self.log_dir),
            "--rdzv-id",
            run_id,
            *args,
        ]
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env if env is not None else dict(os.environ),
                cwd=tmp,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def run_dir(self) -> Path | None:
        found = sorted((self.log_dir / self.run_id).glob("*/events.jsonl"))
        return found[-1].parent if found else None

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        run_dir = self.run_dir()
        if run_dir is None:
            return []
        lines = (run_dir / "events.jsonl").read_text().splitlines()
        # the daemon may be writing the last line right now
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except ValueError:
                break
        return [e for e in events if name is None or e["event"] == name]

    def wait_event(
        self,
        name: str,
        timeout: float = 30.0,
        where: Callable[[dict[str, Any]], bool] = lambda e: True,
        count: int = 1,
    ) -> list[dict[str, Any]]:
        def found() -> list[dict[str, Any]] | None:
            hits = [e for e in self.events(name) if where(e)]
            if len(hits) >= count:
                return hits
            if self.proc.poll() is not None:
                hits = [e for e in self.events(name) if where(e)]
                if len(hits) >= count:
                    return hits
                raise AssertionError(
                    f"daemon exited ({self.proc.returncode}) before {count} {name!r} event(s)\n"
                    + self.stderr()
                )
            return None

        result: list[dict[str, Any]] = wait_until(found, timeout, f"event {name!r} x{count}")
        return result

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise Timeout(f"daemon still running after {timeout}s\n{self.stderr()}") from None

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


def rank_pids(daemon: Daemon, generation: int | None = None) -> list[int]:
    return [
        e["pid"] for e in daemon.events("rank_spawned") if generation is None or e["generation"] == generation
    ]
