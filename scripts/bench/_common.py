"""Shared by the benchmarks in scripts/bench/: /proc readers, process hygiene, a
launcher runner, small statistics. Standard library only; Linux only.

The approach is restart.py's (which predates this module and does not use it yet):

* every launcher runs in its own session (``start_new_session``): the terminal's
  Ctrl-C is ours to handle, and ``killpg`` reaches the launcher and whatever
  shares its group;
* every launcher run has a timeout: then its group gets SIGTERM, then SIGKILL;
* the benchmark makes itself a child subreaper (``become_subreaper``), so anything
  a launcher leaves behind is reparented to it: ``kill_leftovers`` reports it and
  SIGKILLs it (with its process group when it leads one: ranks do);
* Ctrl-C / SIGTERM raise ``Interrupted`` (``install_stop_handlers``); cleanups run
  with those signals held (``signals_held``) so a second Ctrl-C cannot cut them short.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
PR_SET_CHILD_SUBREAPER = 36
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL when we have to stop a launcher
LEFTOVER_GRACE = 3.0  # seconds a launcher's helpers may take to go after it exits


class Interrupted(Exception):
    """Ctrl-C or SIGTERM: stop the current run, report what we have."""


# -- /proc ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcStat:
    state: str
    ppid: int
    pgid: int
    cpu_ticks: int  # utime + stime of the whole thread group


def read_stat(pid: int) -> ProcStat | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after its last ')'
    f = raw[raw.rindex(")") + 2 :].split()
    return ProcStat(f[0], int(f[1]), int(f[2]), int(f[11]) + int(f[12]))


def read_status_kb(pid: int, *keys: str) -> dict[str, int]:
    """VmRSS, VmHWM...: absent for a zombie (it has no memory left)."""
    out: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in keys:
            out[name] = int(value.split()[0])
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def process_table() -> dict[int, ProcStat]:
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = read_stat(int(entry.name))
            if st is not None:
                table[int(entry.name)] = st
    return table


def descendants(root: int, table: dict[int, ProcStat]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, st in table.items():
        children.setdefault(st.ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def has_exited(pid: int) -> bool:
    """True once our child ``pid`` has exited; it stays a zombie (WNOWAIT) so
    that its final /proc/<pid>/stat can still be read."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


# -- hygiene ---------------------------------------------------------------------------


def become_subreaper() -> None:
    # Orphans of the launchers get reparented to us instead of init, so no
    # process a launcher leaves behind escapes the leftover check and cleanup.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("warning: prctl(PR_SET_CHILD_SUBREAPER) failed; leftovers may escape", file=sys.stderr)


def _on_signal(signum: int, _frame: object) -> None:
    raise Interrupted(signal.Signals(signum).name)


def install_stop_handlers() -> None:
    for signum in STOP_SIGNALS:
        # SIGINT too: a shell starts background jobs with it ignored, and then
        # `kill -INT` would not stop us. A SIGHUP ignored on purpose (nohup) stays so.
        if signum == signal.SIGINT or signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _on_signal)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """A second Ctrl-C must not cut a cleanup short: signals wait until it is done."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def killpg(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def our_descendants() -> dict[int, ProcStat]:
    table = process_table()
    return {pid: table[pid] for pid in descendants(os.getpid(), table) if table[pid].state != "Z"}


def reap_children() -> None:
    """Reap orphans reparented to us (we are their subreaper), by pid only:
    never waitpid(-1), which could steal a launcher's status from Popen."""
    table = process_table()
    for pid, st in table.items():
        if st.ppid == os.getpid() and st.state == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def kill_leftovers(grace: float) -> list[str]:
    """Wait ``grace`` for descendants to go by themselves, then SIGKILL each one's
    process group (ranks lead their own) or the process itself; describe them."""
    deadline = time.monotonic() + grace
    left = our_descendants()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        reap_children()
        left = our_descendants()
    described = [f"pid {pid} ({cmdline(pid)[:120]})" for pid in left]
    for _ in range(20):
        if not left:
            break
        for pid, st in left.items():
            if st.pgid == pid:
                killpg(pid, signal.SIGKILL)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
        reap_children()
        left = our_descendants()
    return described


# -- one launcher run -------------------------------------------------------------------


@dataclass(slots=True)
class Sample:
    t_wall: float  # time.time() when read
    cpu_ticks: int
    rss_kb: int | None
    hwm_kb: int | None


@dataclass(slots=True)
class LauncherRun:
    """What we saw of one launcher process (its own figures, not its children's)."""

    argv: list[str]
    exit_code: int | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    final_cpu_ticks: int | None = None  # read from the zombie: exact
    peak_hwm_kb: int = 0
    samples: list[Sample] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)

    @property
    def cpu_s(self) -> float | None:
        return None if self.final_cpu_ticks is None else self.final_cpu_ticks / CLK_TCK

    def cpu_between(self, t0: float, t1: float) -> float | None:
        """CPU seconds the launcher used between wall times t0 and t1 (from the samples
        nearest inside the window; None when the window holds fewer than two)."""
        inside = [s for s in self.samples if t0 <= s.t_wall <= t1]
        if len(inside) < 2:
            return None
        first, last = inside[0], inside[-1]
        span = last.t_wall - first.t_wall
        if span <= 0:
            return None
        # scale to the whole window: samples start and end up to one period inside it
        return (last.cpu_ticks - first.cpu_ticks) / CLK_TCK * (t1 - t0) / span


class Launcher:
    """Start a launcher in its own session; sample /proc while it runs; stop it and
    everything it left behind when it overruns or we are interrupted."""

    def __init__(
        self,
        argv: Sequence[str],
        run_dir: Path,
        *,
        sample_interval: float = 0.05,
        env: dict[str, str] | None = None,
    ) -> None:
        self.run = LauncherRun(list(argv))
        self.run_dir = run_dir
        self.sample_interval = sample_interval
        self._env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self._started = 0.0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        (self.run_dir / "command.txt").write_text(" ".join(self.run.argv) + "\n")
        self._started = time.monotonic()
        with (self.run_dir / "launcher.out").open("wb") as out:
            # its own session: the terminal's Ctrl-C is ours to handle, and killpg
            # reaches the launcher and whatever shares its group
            self.proc = subprocess.Popen(
                self.run.argv, cwd=self.run_dir, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True, env=self._env,
            )  # fmt: skip

    def sample(self) -> None:
        st = read_stat(self.pid)
        if st is None:
            return
        kb = read_status_kb(self.pid, "VmRSS", "VmHWM")
        if "VmHWM" in kb:
            self.run.peak_hwm_kb = max(self.run.peak_hwm_kb, kb["VmHWM"])
        self.run.samples.append(Sample(time.time(), st.cpu_ticks, kb.get("VmRSS"), kb.get("VmHWM")))

    def exited(self) -> bool:
        return has_exited(self.pid)

    def poll(self, seconds: float, deadline: float) -> bool:
        """Sample for up to ``seconds`` (not past ``deadline``, monotonic); True once exited."""
        until = min(time.monotonic() + seconds, deadline)
        while True:
            if self.exited():
                return True
            self.sample()
            if time.monotonic() >= until:
                return False
            time.sleep(self.sample_interval)

    def finish(self, deadline: float) -> None:
        """Sample until the launcher exits or ``deadline`` passes; then stop whatever is
        left (the launcher's group after a timeout, and every leftover descendant)."""
        try:
            exited = self.poll(math.inf, deadline)
            if exited:
                st = read_stat(self.pid)  # a zombie still has its final CPU times
                if st is not None:
                    self.run.final_cpu_ticks = st.cpu_ticks
            self.run.timed_out = not exited
        finally:
            with signals_held():
                self.stop()
                self.run.leftovers = kill_leftovers(LEFTOVER_GRACE)
            self.run.wall_s = time.monotonic() - self._started
            assert self.proc is not None
            self.run.exit_code = self.proc.returncode

    def abort(self) -> None:
        """Stop the launcher and everything it left behind now (we were interrupted)."""
        with signals_held():
            self.stop()
            self.run.leftovers = kill_leftovers(0.0)
        self.run.timed_out = True
        self.run.wall_s = time.monotonic() - self._started
        if self.proc is not None:
            self.run.exit_code = self.proc.returncode

    def stop(self) -> None:
        """SIGTERM the launcher's group, SIGKILL it after a grace, reap it."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        if has_exited(proc.pid):
            proc.wait()
            return
        killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        while not has_exited(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# -- files ---------------------------------------------------------------------------------


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by a killed writer
    return out


def ft_event_log(log_dir: Path) -> Path | None:
    """ft-supervisor's ``<log-dir>/<run id>/<stamp>/events.jsonl``."""
    found = sorted(log_dir.glob("*/*/events.jsonl"))
    return found[0] if found else None


# -- statistics ------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), nearest rank: a value that was observed."""
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, math.ceil(q / 100 * len(ordered)) - 1)
    return ordered[k]


def median(values: Iterable[float | int | None]) -> float | None:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    mid = len(vals) // 2
    return float(vals[mid]) if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def error_message(run_dir: Path, limit: int = 240) -> str | None:
    """The first line of a generation-1 torchelastic error file under ``run_dir/logs``
    (torchrun's ``attempt_1`` or ft-supervisor's ``gen_1``), if a rank wrote one."""
    logs = run_dir / "logs"
    for path in sorted([*logs.glob("**/attempt_1/*/error.json"), *logs.glob("**/gen_1/*/error.json")]):
        try:
            msg = json.loads(path.read_text())["message"]
            text = msg["message"] if isinstance(msg, dict) else str(msg)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        return text.strip().splitlines()[0][:limit]
    return None
