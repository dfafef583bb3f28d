"""Restart benchmark: ft-supervisor against torchrun on the same real training run.

How to run (from the repository root, in the project's virtualenv)::

    .venv/bin/python scripts/bench/restart.py                 # 5 runs of each variant
    .venv/bin/python scripts/bench/restart.py --runs 9 --out /tmp/bench
    .venv/bin/python scripts/bench/restart.py --quick         # 2 runs, shorter training
    .venv/bin/python scripts/bench/restart.py --variants torchrun,ft

Method
------
Each run launches ``scripts/train.py`` (DDP over gloo on CPU, 50 ms steps, a
snapshot every 10 steps) on one node with ``--nproc-per-node 2 --max-restarts 1``
and makes rank 1 crash (``--crash-mode``, default raise) at step ``--crash-at-step``
(default 160, ~8 s in: ft-supervisor's standby ranks are warm by then) in
generation 0 only. The launcher restarts the ranks once; generation 1 resumes
from the snapshot and trains ``--steps-after`` more steps. Variants:

* ``torchrun``: torch's own launcher (single-node default: a c10d store on a free port);
* ``torchrun-noshare``: the same with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, which
  keeps the rendezvous store out of the ranks' way (a restart of the default one can
  fail to connect);
* ``ft``: ``ft-supervisor run`` as shipped: the next generation's ranks are
  pre-started ("standby") and import torch while the current one trains;
* ``ft-cold``: ``ft-supervisor run --no-standby``: no rank is started before the
  failure, but each is forked from the fork server, which imported torch once;
* ``ft-spawn``: ``ft-supervisor run --no-fork-server``: standby ranks, each a fresh
  interpreter importing torch itself (how ft-supervisor started ranks before its
  fork server);
* ``ft-spawn-cold``: both off, ``--no-standby --no-fork-server``: a cold restart like
  torchrun's, which shows how much of the gain the standbys and the server bring.
* ``ft-mapped`` (with ``--memory-mb``): ``ft`` whose generation 1 drops the standby's
  premapped slots before ``restore()``, which then maps the slot itself, and whose first
  snapshots map their slots for writing themselves: as it was before standbys mapped their
  snapshot ahead of their go (``ft`` is the premapped one);
* ``ft-nomem`` (with ``--memory-mb``): ``ft`` without the memory snapshots (the disk
  snapshot only): the restart the others add a memory restore to;
* ``ft-held`` (with ``--memory-mb``): ``ft-nomem`` whose ranks hold the same ballast (allocated
  at start, never snapshotted): the same job as ``ft`` without memory snapshots;
* ``ft-cuda-warm`` (with ``--device cuda``): ``ft`` whose standby ranks also create
  their CUDA context and cuBLAS handle before their go (``--preload`` adds
  ``scripts/_cuda_context.py``): what that saves, and the GPU memory it holds.

On a GPU (``--device cuda``) the ranks put the model and batches on the GPU
(``--nproc`` ranks may share one) and all-reduce with ``--backend`` (gloo or nccl,
which wants a GPU per rank); the table gains the peak GPU memory of the node (NVML,
sampled with the tree) and the GPU memory in use at the crash, which is what the
standby ranks hold then.

The variants are interleaved run by run (torchrun, ft, ft-cold, torchrun, ...) so
that a busy moment of the machine hurts all of them alike. Every run gets its own
directory, run id, log directory, snapshot and event file; nothing is reused.

Figures, per run:

* restart time: the training script's own milestones (``--events``, wall clock
  ``time.time()`` written by the ranks): the latest ``first_step`` of generation 1
  minus the ``crash`` of generation 0. It covers detection, tearing down the old
  ranks, starting the new ones (python + ``import torch``, unless pre-started),
  the gloo rendezvous, loading the snapshot and one 50 ms step.
* success: generation 1 wrote ``done`` on every rank and the launcher exited 0.
  Restart-time, CPU and memory statistics use successful runs only (all finished
  runs when a variant had no success; the table marks that).
* crash -> noticed: from the ``crash`` milestone to the launcher acting on it:
  ft-supervisor's ``rank_exited`` event; torchrun's first log line about it
  ("Sending process ... closing signal" / "failed (exitcode"). It includes the
  failing rank's own exit (traceback, error file, interpreter shutdown with torch
  loaded), so it is an upper bound on the launcher's detection latency.
* launcher peak RSS and CPU: sampled every ~50 ms from ``/proc/<pid>/status``
  (VmHWM, the kernel's peak RSS) and ``/proc/<pid>/stat`` (utime+stime) of the
  launcher process itself; the final CPU figure is read once the launcher has
  exited but before it is reaped, so it is exact. Ranks are not counted. Helper
  processes the launcher starts that are not ranks (ft-supervisor's orphan
  sentinel) are reported in their own column. ft-supervisor's own figures (the
  ``run_finished`` event: ``daemon_max_rss_kb``, ``daemon_cpu_s``) are compared
  with the sampled ones below the table.
* whole tree peak PSS (not with ``--no-pss``): the launcher, its helpers and all ranks,
  standby ranks included, summed every ~0.5 s (PSS from ``/proc/<pid>/smaps_rollup``, so pages
  the ranks share, torch's libraries, count once). This is what the standby
  ranks cost: two more processes with torch imported while generation 0 trains.

Hygiene: every run has a timeout (``--timeout``); then the launcher's process
group gets SIGTERM, then SIGKILL, and so does every process it left behind. This
script makes itself a child subreaper, so anything a launcher leaves behind is
reparented here: it is reported as a leftover and SIGKILLed, with its process
group when it leads one (ranks do). Ctrl-C (or SIGTERM) stops the current run the same way and prints what was
measured so far. Artifacts stay in ``--out`` (default: a fresh temporary
directory) for inspection: ``<variant>-<n>/launcher.out``, ``events.jsonl``,
``logs/``, ``results.json``;
``scripts/bench/restart_phases.py <out>`` splits each ft-supervisor run into its phases.

Linux only (``/proc``, ``prctl``). Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _common import error_message

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "scripts" / "train.py"
NPROC = 2
CRASH_RANK = 1
SAMPLE_INTERVAL = 0.05  # launcher /proc sampling period
SCAN_EVERY = 10  # scan the process tree every 10 samples (~0.5 s): it costs more
STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL when we have to stop a launcher
LEFTOVER_GRACE = 3.0  # seconds a launcher's helpers may take to go after it exits
CLK_TCK = os.sysconf("SC_CLK_TCK")
PR_SET_CHILD_SUBREAPER = 36
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
VARIANT_NAMES = ("torchrun", "torchrun-noshare", "ft", "ft-cold", "ft-spawn", "ft-spawn-cold", "ft-cuda-warm",
                 "ft-mapped", "ft-nomem", "ft-held")  # fmt: skip
MEMORY_VARIANTS = ("ft-mapped", "ft-nomem", "ft-held")  # only with --memory-mb
# ft-cuda-warm: what the daemon preloads by default, and the module that makes the CUDA context
CUDA_WARM_PRELOAD = "torch,torch.distributed,torch.nn.parallel,torch._dynamo,_cuda_context"
TORCHRUNS = ("torchrun", "torchrun-noshare")
# torchrun's agent shares its rendezvous TCP store with the ranks; a generation that
# starts while the last one's store port is still held fails to connect (gloo's
# "Connection refused"). Torch's own switch turns the sharing off.
NOSHARE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
LABELS = {
    "torchrun": "torchrun",
    "torchrun-noshare": "torchrun (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)",
    "ft": "ft-supervisor",
    "ft-cold": "ft-supervisor --no-standby",
    "ft-spawn": "ft-supervisor --no-fork-server",
    "ft-spawn-cold": "ft-supervisor --no-standby --no-fork-server",
    "ft-cuda-warm": "ft-supervisor, standbys make the CUDA context",
    "ft-mapped": "ft-supervisor, restore() maps after the go",
    "ft-nomem": "ft-supervisor, no memory snapshots",
    "ft-held": "ft-supervisor, state held, no memory snapshots",
}


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


def pss_kb(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


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


def become_subreaper() -> None:
    # Orphans of the launchers get reparented to us instead of init, so no
    # process a launcher leaves behind escapes the leftover check and cleanup.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("warning: prctl(PR_SET_CHILD_SUBREAPER) failed; leftovers may escape", file=sys.stderr)


# -- one launcher run ---------------------------------------------------------------


@dataclass(slots=True)
class Usage:
    """What we saw of the launcher process while it ran."""

    peak_rss_kb: int = 0  # VmHWM of the last sample that had one
    cpu_ticks: int = 0
    helper_hwm_kb: dict[int, int] = field(default_factory=dict)  # non-rank children
    tree_pss_kb: int = 0  # peak of the summed PSS of the launcher and all it started


class LauncherWatch:
    """Samples a launcher until it exits; stops it and all it started when asked."""

    def __init__(self, proc: subprocess.Popen[bytes], gpu: Any = None, *, pss: bool = True) -> None:
        self.pss = pss
        self.proc = proc
        self.usage = Usage()
        self.gpu = gpu  # an NVML device handle (--device cuda), else None
        self.gpu_samples: list[tuple[float, int]] = []  # (wall time, bytes in use on the GPU)

    def sample(self) -> None:
        kb = read_status_kb(self.proc.pid, "VmHWM")
        if "VmHWM" in kb:
            self.usage.peak_rss_kb = kb["VmHWM"]
        st = read_stat(self.proc.pid)
        if st is not None:
            self.usage.cpu_ticks = st.cpu_ticks

    def scan_tree(self) -> None:
        table = process_table()
        tree = descendants(self.proc.pid, table)
        for pid in tree:
            if pid in self.usage.helper_hwm_kb or str(TRAIN) not in cmdline(pid):
                # not a rank (ranks run train.py): ft-supervisor's sentinel, say
                hwm = read_status_kb(pid, "VmHWM").get("VmHWM", 0)
                self.usage.helper_hwm_kb[pid] = max(hwm, self.usage.helper_hwm_kb.get(pid, 0))
        # PSS, not RSS: the ranks share torch's pages; RSS would count them once per rank
        live = [pid for pid in [self.proc.pid, *tree] if pid in table and table[pid].state != "Z"]
        if self.pss:
            self.usage.tree_pss_kb = max(self.usage.tree_pss_kb, sum(pss_kb(pid) for pid in live))
        if self.gpu is not None:
            import pynvml  # noqa: PLC0415 - only with --device cuda (nvidia-ml-py)

            self.gpu_samples.append((time.time(), int(pynvml.nvmlDeviceGetMemoryInfo(self.gpu).used)))

    def wait(self, timeout: float) -> bool:
        """Sample until the launcher exits (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        n = 0
        while not has_exited(self.proc.pid):
            if time.monotonic() > deadline:
                return False
            self.sample()
            if n % SCAN_EVERY == 0:
                self.scan_tree()
            n += 1
            time.sleep(SAMPLE_INTERVAL)
        self.sample()  # a zombie still has its final CPU times (no memory figures)
        self.proc.wait()
        return True

    def stop(self) -> None:
        """SIGTERM the launcher's group, SIGKILL it after a grace, reap it."""
        if self.proc.returncode is not None:
            return
        killpg(self.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        while not has_exited(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


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


HOGS: set[int] = set()  # --hogs: ours, but no launcher's leftovers


def our_descendants() -> dict[int, ProcStat]:
    table = process_table()
    return {
        pid: table[pid]
        for pid in descendants(os.getpid(), table)
        if table[pid].state != "Z" and pid not in HOGS
    }


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


# -- the variants -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    runs: int
    variants: tuple[str, ...]
    crash_at_step: int
    steps_after: int
    step_time: float
    crash_mode: str
    timeout: float
    out: Path
    bin_dir: Path
    hogs: int = 0
    device: str = "cpu"
    backend: str = "gloo"
    nproc: int = NPROC
    memory_mb: float = 0.0  # --memory-mb: client.snapshot every step, restore() at start
    pss: bool = True  # --no-pss: no whole-tree PSS column (its page-table walks stall big ranks)


def train_args(s: Settings, run_dir: Path, *, memory_mb: float | None = None) -> list[str]:
    mb = s.memory_mb if memory_mb is None else memory_mb
    memory = ["--memory-snapshot-mb", str(mb)] if mb > 0 else []
    return [
        str(TRAIN),
        "--steps", str(s.crash_at_step + s.steps_after),
        "--step-time", str(s.step_time),
        "--snapshot", str(run_dir / "snapshot.pt"),
        "--crash-at-step", str(s.crash_at_step),
        "--crash-rank", str(CRASH_RANK),
        "--crash-generations", "0",
        "--crash-mode", s.crash_mode,
        "--events", str(run_dir / "events.jsonl"),
        "--device", s.device,
        "--backend", s.backend,
        *memory,
    ]  # fmt: skip


def launcher_argv(variant: str, s: Settings, run_dir: Path) -> list[str]:
    # No --master-port: both launchers then pick a free port themselves.
    common = [
        "--nproc-per-node", str(s.nproc),
        "--max-restarts", "1",
        "--rdzv-id", f"bench-{variant}-{uuid.uuid4().hex[:8]}",
        "--log-dir", str(run_dir / "logs"),
    ]  # fmt: skip
    if variant in TORCHRUNS:
        # torchrun's single-node default replaces the rdzv id with a fresh uuid
        return [str(s.bin_dir / "torchrun"), *common, *train_args(s, run_dir)]
    extra = {
        "ft-cold": ["--no-standby"],
        "ft-spawn": ["--no-fork-server"],
        "ft-spawn-cold": ["--no-standby", "--no-fork-server"],
        # a CUDA context cannot be forked: these standbys are spawned
        "ft-cuda-warm": ["--no-fork-server", "--preload", CUDA_WARM_PRELOAD],
    }.get(variant, [])
    script = train_args(s, run_dir, memory_mb=0 if variant == "ft-nomem" else None)
    script += ["--no-premap"] if variant == "ft-mapped" else []
    script += ["--hold-only"] if variant == "ft-held" else []
    return [str(s.bin_dir / "ft-supervisor"), "run", *common, *extra, *script]


@functools.cache
def gpu_handle() -> Any:
    """NVML's handle of the GPU the ranks use (the first one they see)."""
    import pynvml  # noqa: PLC0415 - only with --device cuda (nvidia-ml-py)

    pynvml.nvmlInit()
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return pynvml.nvmlDeviceGetHandleByIndex(int(first) if first.isdigit() else 0)


# -- what a run left behind ----------------------------------------------------------


@dataclass(slots=True)
class RunResult:
    variant: str
    index: int
    run_dir: str
    exit_code: int | None = None
    timed_out: bool = False
    ok: bool = False
    restart_s: float | None = None
    startup_s: float | None = None  # launcher started -> every rank of generation 0 stepping
    notice_s: float | None = None
    standby_lead_s: float | None = None  # ft: standby spawned this long before the crash
    peak_rss_kb: int | None = None
    cpu_s: float | None = None
    helper_rss_kb: int = 0
    tree_pss_kb: int = 0
    reported_rss_kb: int | None = None  # ft-supervisor's run_finished figures
    reported_cpu_s: float | None = None
    failure: str | None = None
    leftovers: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    launched_at: float | None = None  # wall clock, as the ranks' milestones
    step_s: float | None = None  # generation 0's median step time on the crashing rank
    gpu_peak_mb: float | None = None  # --device cuda: the GPU's memory in use, at its peak
    gpu_at_crash_mb: float | None = None  # ... at the last sample before the crash
    restore_s: float | None = None  # --memory-mb: generation 1's slowest restore() call
    served: str | None = None  # ... and how its ranks read their slots (premapped, mapped)


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


def milestones(events: list[dict[str, Any]], what: str, generation: int) -> dict[int, float]:
    return {e["rank"]: e["t"] for e in events if e["event"] == what and e["generation"] == generation}


def ft_events(run_dir: Path) -> list[dict[str, Any]]:
    found = sorted((run_dir / "logs").glob("*/*/events.jsonl"))
    return read_jsonl(found[0]) if found else []


GLOG = re.compile(
    r"^[IWE](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+) +\d+ \S+\] "
    r"(?:Sending process \d+ closing signal|failed \(exitcode)"
)


def torchrun_notice_time(output: str, near: float) -> float | None:
    """Wall time of torchrun's first log line about the failure (glog: local time,
    no year: take the year of the crash)."""
    for line in output.splitlines():
        m = GLOG.match(line)
        if m:
            month, day, hh, mm, ss, frac = m.groups()
            year = time.localtime(near).tm_year
            t = time.mktime((year, int(month), int(day), int(hh), int(mm), int(ss), 0, 0, -1))
            return t + float("0." + frac)
    return None


def last_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    return lines[-1][:240] if lines else "(no output)"


def analyse(r: RunResult, run_dir: Path, s: Settings) -> None:
    events = read_jsonl(run_dir / "events.jsonl")
    crash = milestones(events, "crash", 0).get(CRASH_RANK)
    first = milestones(events, "first_step", 1)
    first0 = milestones(events, "first_step", 0)
    done = milestones(events, "done", 1)
    nproc = s.nproc
    step = [e.get("step_s") for e in events if e["event"] == "crash" and e["generation"] == 0]
    r.step_s = step[0] if step else None
    restored = [e for e in events if e["event"] == "restored" and e["generation"] == 1]
    if restored:
        r.restore_s = max(e["seconds"] for e in restored)
        r.served = ",".join(sorted({str(e.get("served")) for e in restored}))
    if len(first0) == nproc and r.launched_at is not None:
        r.startup_s = max(first0.values()) - r.launched_at
    output = (run_dir / "launcher.out").read_text(errors="replace")
    if crash is not None and len(first) == nproc:
        r.restart_s = max(first.values()) - crash
    r.ok = len(done) == nproc and r.exit_code == 0 and r.restart_s is not None
    if not r.ok:
        r.failure = (
            f"timed out after {s.timeout:.0f} s"
            if r.timed_out
            else error_message(run_dir)
            or (f"generation 1 finished on {len(done)}/{nproc} ranks" if r.exit_code == 0 else None)
            or f"exit {r.exit_code}: {last_line(output)}"
        )
    if r.variant in TORCHRUNS:
        # after a timeout its first log lines may be about our own SIGTERM
        if crash is not None and not r.timed_out:
            noticed = torchrun_notice_time(output, crash)
            r.notice_s = None if noticed is None else noticed - crash
    else:
        ft_details(r, ft_events(run_dir), crash)


def ft_details(r: RunResult, fte: list[dict[str, Any]], crash: float | None) -> None:
    """Detection time, standby head start and self-reported usage from the event log."""
    finish = next((e for e in fte if e["event"] == "run_finished"), None)
    if finish is not None:
        r.reported_rss_kb = finish.get("daemon_max_rss_kb")
        r.reported_cpu_s = finish.get("daemon_cpu_s")
    if crash is None:
        return
    exits = [
        e["t_wall"]
        for e in fte
        if e["event"] == "rank_exited" and e["generation"] == 0 and e.get("state") == "failed"
    ]
    r.notice_s = min(exits) - crash if exits else None
    standby = [e["t_wall"] for e in fte if e["event"] == "rank_spawned" and e.get("standby")]
    r.standby_lead_s = crash - max(standby) if standby else None


def run_once(variant: str, index: int, s: Settings) -> RunResult:
    run_dir = s.out / f"{variant}-{index}"
    run_dir.mkdir(parents=True)
    r = RunResult(variant, index, str(run_dir))
    argv = launcher_argv(variant, s, run_dir)
    (run_dir / "command.txt").write_text(" ".join(argv) + "\n")
    started = time.monotonic()
    r.launched_at = time.time()
    with (run_dir / "launcher.out").open("wb") as out:
        # its own session: the terminal's Ctrl-C is ours to handle, and killpg
        # reaches the launcher and whatever shares its group
        proc = subprocess.Popen(
            argv, cwd=run_dir, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(NOSHARE_ENV if r.variant == "torchrun-noshare" else {})},
        )  # fmt: skip
    watch = LauncherWatch(proc, gpu_handle() if s.device == "cuda" else None, pss=s.pss)
    try:
        r.timed_out = not watch.wait(s.timeout)
    finally:
        with signals_held():
            watch.stop()  # no-op when it exited by itself
            r.leftovers = kill_leftovers(LEFTOVER_GRACE)
    r.wall_s = time.monotonic() - started
    r.exit_code = proc.returncode
    if not r.timed_out:
        r.peak_rss_kb = watch.usage.peak_rss_kb or None
        r.cpu_s = watch.usage.cpu_ticks / CLK_TCK
    r.helper_rss_kb = sum(watch.usage.helper_hwm_kb.values())
    r.tree_pss_kb = watch.usage.tree_pss_kb
    analyse(r, run_dir, s)
    if watch.gpu_samples:
        r.gpu_peak_mb = max(b for _, b in watch.gpu_samples) / 2**20
        crash = milestones(read_jsonl(run_dir / "events.jsonl"), "crash", 0).get(CRASH_RANK)
        before = [b for t, b in watch.gpu_samples if crash is not None and t <= crash]
        r.gpu_at_crash_mb = before[-1] / 2**20 if before else None
    return r


# -- the table -----------------------------------------------------------------------------


def fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def median(xs: Iterable[float | int | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def basis(results: list[RunResult]) -> tuple[list[RunResult], bool]:
    """Runs to take CPU and memory from: the successful ones, else all that finished."""
    ok = [r for r in results if r.ok]
    return (ok, False) if ok else ([r for r in results if not r.timed_out], True)


def restart_median(rs: list[RunResult]) -> float | None:
    return median(r.restart_s for r in rs if r.ok)


def row(label: str, rs: list[RunResult], ref: float | None, gpu: bool = False) -> str:
    times = [r.restart_s for r in rs if r.ok and r.restart_s is not None]
    med = median(times)
    span = f"{fmt(med)} ({fmt(min(times))}-{fmt(max(times))})" if times else "n/a"
    ratio = fmt(med / ref) if med is not None and ref else "n/a"
    worst = fmt(max(times) / ref) if times and ref else "n/a"
    starts = [r.startup_s for r in rs if r.startup_s is not None]
    start_span = f"{fmt(median(starts))} ({fmt(min(starts))}-{fmt(max(starts))})" if starts else "n/a"
    use, fallback = basis(rs)
    mark = "†" if fallback and use else ""
    rss = median(r.peak_rss_kb for r in use)
    return (
        f"| {label} | {sum(r.ok for r in rs)}/{len(rs)}{mark} | {span} | {ratio} | {worst} | {start_span} "
        f"| {fmt(median(r.notice_s for r in rs))} "
        f"| {fmt(None if rss is None else rss / 1024, 1)} "
        f"| {fmt(median(r.cpu_s for r in use))} "
        f"| {fmt(median(r.helper_rss_kb / 1024 for r in use), 1)} "
        f"| {fmt(median(r.tree_pss_kb / 1024 for r in use), 0)} |" + (gpu_cells(use) if gpu else "")
    )


def gpu_cells(use: list[RunResult]) -> str:
    step = median(r.step_s for r in use)
    return (
        f" {fmt(median(r.gpu_peak_mb for r in use), 0)} | {fmt(median(r.gpu_at_crash_mb for r in use), 0)} "
        f"| {fmt(None if step is None else step * 1000, 1)} |"
    )


def table(results: list[RunResult], variants: Iterable[str], gpu: bool = False) -> str:
    by = {v: [r for r in results if r.variant == v] for v in variants}
    # the torchrun that restarts: the default one fails on this machine (see NOSHARE_ENV)
    ref = restart_median(by.get("torchrun", [])) or restart_median(by.get("torchrun-noshare", []))
    rows = [
        "| launcher | restarts ok | restart time median (min-max) s | ratio vs torchrun "
        "| slowest vs torchrun | start -> stepping s | crash -> noticed s | launcher peak RSS MiB "
        "| launcher CPU s | helper procs RSS MiB | whole tree peak PSS MiB |"
        + (" GPU memory peak MiB | GPU memory at the crash MiB | generation 0 step ms |" if gpu else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if gpu else ""),
    ]
    rows.extend(row(LABELS[v], rs, ref, gpu) for v, rs in by.items() if rs)
    return "\n".join(rows)


def standby_gain(results: list[RunResult]) -> str | None:
    """ft-supervisor against itself without standby ranks: meaningful even when
    torchrun failed every restart."""
    warm = restart_median([r for r in results if r.variant == "ft"])
    cold = restart_median([r for r in results if r.variant == "ft-cold"])
    if warm is None or cold is None:
        return None
    return (
        f"Standby ranks: ft-supervisor restarts in {warm:.2f} s with them, {cold:.2f} s without "
        f"(ratio {warm / cold:.2f}, {cold - warm:.2f} s saved)."
    )


def restores(results: list[RunResult], variants: Iterable[str]) -> list[str]:
    """--memory-mb: each variant's restore() in generation 1 (the slowest rank's, median)."""
    out = []
    for v in variants:
        rs = [r for r in results if r.variant == v and r.ok and r.restore_s is not None]
        if rs:
            served = ",".join(sorted({r.served or "-" for r in rs}))
            times = [r.restore_s for r in rs if r.restore_s is not None]
            out.append(f"- {LABELS[v]}: restore() median {fmt(median(times), 3)} s (min-max "
                       f"{fmt(min(times), 3)}-{fmt(max(times), 3)}), slots read {served}")  # fmt: skip
    return out


def notes(results: list[RunResult]) -> list[str]:
    out = []
    for r in results:
        if not r.ok:
            out.append(f"- {LABELS[r.variant]} run {r.index} failed: {r.failure}")
        if r.leftovers:
            # after a timeout we may have SIGKILLed the launcher ourselves: not its fault then
            what = "still ran after the timeout kill" if r.timed_out else "were left behind by the launcher"
            out.append(f"- {LABELS[r.variant]} run {r.index}: processes {what}: {'; '.join(r.leftovers)}")
        if r.standby_lead_s is not None and r.standby_lead_s < 3.0:
            out.append(
                f"- {LABELS[r.variant]} run {r.index}: standby ranks spawned only {r.standby_lead_s:.1f} s "
                "before the crash: they may still have been importing torch (raise --crash-at-step)"
            )
    out.extend(cross_check(results))
    return out


def cross_check(results: list[RunResult]) -> list[str]:
    """Compare our /proc samples with what ft-supervisor reports about itself."""
    out = []
    for r in results:
        if r.reported_rss_kb is None or r.peak_rss_kb is None or r.cpu_s is None:
            continue
        rss_off = abs(r.peak_rss_kb - r.reported_rss_kb) > max(1024, 0.05 * r.reported_rss_kb)
        cpu_off = r.reported_cpu_s is not None and abs(r.cpu_s - r.reported_cpu_s) > max(
            0.05, 0.1 * r.reported_cpu_s
        )
        if rss_off or cpu_off:
            out.append(
                f"- {LABELS[r.variant]} run {r.index}: sampled peak RSS {r.peak_rss_kb / 1024:.1f} MiB, "
                f"CPU {r.cpu_s:.2f} s; the daemon reports {r.reported_rss_kb / 1024:.1f} MiB, "
                f"{r.reported_cpu_s} s"
            )
    checked = [r for r in results if r.reported_rss_kb is not None and r.peak_rss_kb is not None]
    if checked and not out:
        out.append(
            f"- ft-supervisor's self-reported peak RSS and CPU (run_finished) agree with the "
            f"/proc samples in all {len(checked)} runs (within 5% / 10%)."
        )
    return out


def report(results: list[RunResult], s: Settings) -> None:
    print(table(results, s.variants, gpu=s.device == "cuda"))
    print()
    print(
        f"{s.nproc} ranks ({s.device}, {s.backend}); rank {CRASH_RANK} crashes ({s.crash_mode}) "
        f"at step {s.crash_at_step} of generation 0; "
        f"{s.step_time * 1000:.0f} ms steps, {s.steps_after} steps after the restart.\n"
        + (f"{s.hogs} busy processes (one core each) ran beside every run.\n" if s.hogs else "")
        + "Restart time: crash -> last rank's first step of generation 1, successful runs only. "
        "Slowest: the slowest run / torchrun's median. Start -> stepping: the launcher started -> "
        "the last rank's first step of generation 0 (all runs that got there).\n"
        "Ratio: median / torchrun's median (the noshare one's when the default one never restarted).\n"
        "crash -> noticed: includes the dying rank's own exit (all runs with a crash).\n"
        "Launcher RSS (VmHWM) and CPU: the launcher process alone; helper procs: its children that are "
        "not ranks; whole tree PSS: launcher + helpers + ranks (+ standby ranks), sampled every ~0.5 s. "
        "Medians over successful runs († none succeeded: over all finished runs).\n"
        f"Artifacts: {s.out}"
    )
    extra = [line for line in [standby_gain(results)] if line]
    extra += restores(results, s.variants) + notes(results)
    if extra:
        print()
        print("\n".join(extra))
    sys.stdout.flush()


# -- main -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=None, help="runs per variant (default 5; 2 with --quick)")
    p.add_argument(
        "--variants",
        default=",".join(v for v in VARIANT_NAMES if v not in MEMORY_VARIANTS),
        help=f"comma-separated subset of {','.join(VARIANT_NAMES)} (default: all but the --memory-mb ones)",
    )
    p.add_argument("--quick", action="store_true", help="2 runs, 10 steps after the restart: a smoke test")
    p.add_argument(
        "--no-pss",
        action="store_true",
        help="no whole-tree PSS column: reading smaps_rollup walks every page table of every rank, "
        "under the rank's mmap lock, which stalls ranks that map GBs of snapshot slots",
    )
    p.add_argument("--crash-at-step", type=int, default=160, help="late enough for standbys to be warm")
    p.add_argument("--steps-after", type=int, default=None, help="steps after the restart (default 40)")
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--crash-mode", choices=["raise", "exit", "abort", "segv"], default="raise")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a run is killed")
    p.add_argument("--out", type=Path, default=None, help="artifact directory (default: a fresh tempdir)")
    p.add_argument("--hogs", type=int, default=0, help="busy processes (one core each) beside the runs")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the ranks train")
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo", help="the ranks' process group")
    p.add_argument("--nproc", type=int, default=NPROC, help=f"ranks (default {NPROC})")
    p.add_argument(
        "--memory-mb",
        type=float,
        default=0.0,
        help="MB of state a rank snapshots in memory every step, restores after (0: none)",
    )
    p.add_argument(
        "--bin-dir",
        type=Path,
        default=Path(sys.executable).parent,  # not resolved: the venv's bin, not /usr/bin
        help="where torchrun and ft-supervisor are (default: next to this python)",
    )
    a = p.parse_args(argv)
    variants = tuple(v.strip() for v in a.variants.split(",") if v.strip())
    unknown = [v for v in variants if v not in VARIANT_NAMES]
    if unknown or not variants:
        p.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANT_NAMES)}")
    if "ft-cuda-warm" in variants and a.device != "cuda":
        p.error("--variants ft-cuda-warm: only with --device cuda")
    if a.memory_mb <= 0 and (memory := [v for v in variants if v in MEMORY_VARIANTS]):
        p.error(f"--variants {','.join(memory)}: only with --memory-mb")
    if a.nproc < 1:
        p.error("--nproc must be at least 1")
    global CRASH_RANK  # noqa: PLW0603 - one setting for the whole run, read where it is reported
    CRASH_RANK = min(1, a.nproc - 1)  # rank 1, or the only rank: a group of one on a node with idle cores
    for tool in {"torchrun" if v in TORCHRUNS else "ft-supervisor" for v in variants}:
        if not (a.bin_dir / tool).exists():
            p.error(
                f"{a.bin_dir / tool} not found: run with the project's .venv/bin/python or pass --bin-dir"
            )
    runs = a.runs if a.runs is not None else 2 if a.quick else 5
    if runs < 1:
        p.error("--runs must be at least 1")
    out = a.out or Path(tempfile.mkdtemp(prefix="ft-bench-restart-"))
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        p.error(f"--out {out} is not empty: give a fresh directory")
    steps_after = a.steps_after if a.steps_after is not None else 10 if a.quick else 40
    return Settings(
        runs, variants, a.crash_at_step, steps_after, a.step_time, a.crash_mode, a.timeout, out.resolve(),
        a.bin_dir, max(0, a.hogs), a.device, a.backend, a.nproc, a.memory_mb, not a.no_pss,
    )  # fmt: skip


def warm_up(s: Settings) -> None:
    # The first `import torch` after a while reads torch from disk; do it once
    # before timing so that whichever variant runs first does not pay for it.
    subprocess.run([sys.executable, "-c", "import torch"], check=False, timeout=s.timeout)


def start_hogs(n: int) -> list[subprocess.Popen[bytes]]:
    """A busy node: ``n`` processes that each keep one core busy for the whole benchmark."""
    hogs = [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL, start_new_session=True
        )
        for _ in range(n)
    ]
    HOGS.update(h.pid for h in hogs)
    return hogs


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:
        hog.kill()
        hog.wait()


def schedule(s: Settings) -> Iterator[tuple[int, str]]:
    for index in range(1, s.runs + 1):
        for variant in s.variants:
            yield index, variant


def on_signal(signum: int, _frame: object) -> None:
    raise Interrupted(signal.Signals(signum).name)


def describe(r: RunResult) -> str:
    status = "ok" if r.ok else "FAILED"
    return (
        f"{LABELS[r.variant]:<27} run {r.index}: {status:<6} restart {fmt(r.restart_s)} s, "
        f"noticed {fmt(r.notice_s)} s, rss {fmt(None if r.peak_rss_kb is None else r.peak_rss_kb / 1024, 1)}"
        f" MiB, cpu {fmt(r.cpu_s)} s, wall {r.wall_s:.1f} s"
        + (f", restore {fmt(r.restore_s, 3)} s ({r.served})" if r.restore_s is not None else "")
    )


def main(argv: list[str] | None = None, progress: Callable[[str], None] = lambda m: None) -> int:
    s = parse_args(argv)
    become_subreaper()
    for signum in STOP_SIGNALS:
        # SIGINT too: a shell starts background jobs with it ignored, and then
        # `kill -INT` would not stop us. A SIGHUP ignored on purpose (nohup) stays so.
        if signum == signal.SIGINT or signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, on_signal)
    results: list[RunResult] = []
    code = 0
    hogs = start_hogs(s.hogs)
    try:
        warm_up(s)
        for index, variant in schedule(s):
            r = run_once(variant, index, s)
            results.append(r)
            progress(describe(r))
    except (KeyboardInterrupt, Interrupted) as exc:
        progress(f"interrupted ({type(exc).__name__} {exc}): reporting the {len(results)} finished runs")
        with signals_held():
            kill_leftovers(0.0)  # a safety net: whatever of ours still runs goes now
        code = 130
    finally:
        stop_hogs(hogs)
    (s.out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    if results:
        report(results, s)
    return code


if __name__ == "__main__":
    sys.exit(main(progress=lambda m: print(m, file=sys.stderr, flush=True)))
