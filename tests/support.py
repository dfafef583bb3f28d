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
# What a Lightning job preloads: Lightning as well as torch. Its import (2.4 CPU-s here)
# is then paid once, by the node's fork server, not by every rank of every generation;
# Lightning itself imports torch._dynamo, so nothing of its exit changes (docs/guides/standbys.md).
LIGHTNING_PRELOAD = ("--preload", "torch,torch.distributed,torch.nn.parallel,lightning.pytorch")
PL_PRELOAD = ("--preload", "torch,torch.distributed,torch.nn.parallel,pytorch_lightning")
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
        self,
        tmp: Path,
        args: Iterable[str],
        env: dict[str, str] | None = None,
        run_id: str = "t",
        prefix: Iterable[str] = (),  # a wrapper that execs the daemon (setpriv...)
    ) -> None:
        self.tmp = tmp
        self.log_dir = tmp / "logs"
        self.run_id = run_id
        self.stdout_path = tmp / "daemon.stdout"
        self.stderr_path = tmp / "daemon.stderr"
        argv = [
            *prefix,
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
            raise Timeout(f"daemon still running after {timeout}s\n{self.story()}") from None

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def story(self, tail: int = 40) -> str:
        """A failed assertion's message: the daemon's own lines (its decisions and why),
        then the last lines of the ranks' output, then the daemon's lines again; a CI
        excerpt cut at either end still shows what the daemon decided."""
        lines = self.stderr().splitlines()
        own = "\n".join(line for line in lines if line.startswith("[ft-supervisor]"))
        ranks = "\n".join([line for line in lines if not line.startswith("[ft-supervisor]")][-tail:])
        code = self.proc.poll()
        return f"exit code {code}\n{own}\n--- ranks (last {tail} lines):\n{ranks}\n--- daemon:\n{own}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def disagreements(self) -> list[str]:
        """Every run directory it left a reason file in, judged again in this process by
        ``ft-supervisor classify``'s code: what that judgement and the reason file
        disagree on, both sides shown (see ``supervisor.postmortem.agree``)."""
        from supervisor.postmortem import disagreements, judge_run  # noqa: PLC0415
        from supervisor.postmortem.render import render_run  # noqa: PLC0415

        out = []
        for reason_file in sorted(self.log_dir.glob("*/*/reason.json")):
            run_dir = reason_file.parent
            try:
                reason = json.loads(reason_file.read_text())
            except ValueError:
                continue  # being written when the daemon was killed
            # everything it needs is in the run's own event log (run_started, plugins_loaded)
            verdict = judge_run(run_dir)
            differ = disagreements(verdict, reason)
            if differ:
                daemon = {k: reason.get(k) for k in ("outcome", "rule", "rank", "decision", "last_failure")}
                decisions = [
                    {k: e.get(k) for k in ("generation", "action", "reason", "rule", "rank", "restarts_used")}
                    for e in _decisions(run_dir)
                ]
                out.append(
                    f"{run_dir}:\n" + "\n".join(f"  {d}" for d in differ)
                    + f"\n--- ft-supervisor classify:\n{render_run(verdict)}"
                    + f"\n--- reason.json:\n{json.dumps(daemon, indent=2)}"
                    + "\n--- decision events:\n" + "\n".join(json.dumps(d) for d in decisions)
                )
        return out


def _decisions(run_dir: Path) -> list[dict[str, Any]]:
    found = []
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "decision":
            found.append(event)
    return found


def rank_pids(daemon: Daemon, generation: int | None = None) -> list[int]:
    return [
        e["pid"] for e in daemon.events("rank_spawned") if generation is None or e["generation"] == generation
    ]


def unshare_pid_refused() -> str | None:
    """Why a process cannot be started in a pid namespace of its own here (None: it can)."""
    try:
        r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    except FileNotFoundError:
        return "unshare(1) is not installed"
    return None if r.returncode == 0 else f"unshare --pid is not permitted here: {r.stderr.strip()}"


def write_slot(path: Path, state: Any, step: int, *, size: int | None = None) -> tuple[int, str]:
    """What a rank does with a slot file the daemon sized (grown to ``size``, never shrunk):
    map it, copy ``state`` in, seal, checksum. The bytes and the checksum it would report."""
    from supervisor.client import snapshot_slots as slotfile  # noqa: PLC0415

    p = slotfile.plan(state)
    with path.open("ab") as f:
        f.truncate(max(size if size is not None else p.total, f.tell()))
    writer = slotfile.Writer(slotfile.map_for_writing(str(path), p.total))
    try:
        writer.write(p, step)
        return p.total, slotfile.checksum(writer.mapping, p.total)
    finally:
        writer.close()
