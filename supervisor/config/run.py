"""One frozen, validated configuration for a run.

Built once from the command line (and torchrun's PET_* variables); the rest of
the daemon never sees a raw string. Every problem raises ConfigError naming the
option and the expected form.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.config.checkpoints import CheckpointConfig
from supervisor.config.errors import ConfigError
from supervisor.config.ft import FtConfig
from supervisor.config.health import HealthConfig
from supervisor.config.hosting import HostingConfig
from supervisor.config.metrics import MetricsConfig
from supervisor.config.policy import PolicyConfig
from supervisor.config.rendezvous import RdzvConfig
from supervisor.core.program import Program
from supervisor.core.stragglers import StragglerSettings
from supervisor.core.topology import Topology
from supervisor.log import STDERR, STDOUT

STD_NONE, STD_OUT, STD_ERR, STD_ALL = 0, 1, 2, 3
DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


def parse_std(option: str, value: str, nproc: int) -> dict[int, int]:
    """torchrun's std spec: ``3`` for every local rank, or ``0:1,1:2`` per rank."""
    value = value.strip()
    if re.fullmatch(r"[0-3]", value):
        return dict.fromkeys(range(nproc), int(value))
    if not re.fullmatch(r"\d+:[0-3](,\d+:[0-3])*", value):
        raise ConfigError(
            f"{option} {value!r}: expected 0-3 (0 none, 1 stdout, 2 stderr, 3 both) "
            "or a per-local-rank map such as 0:1,1:2"
        )
    spec = dict.fromkeys(range(nproc), STD_NONE)
    for item in value.split(","):
        rank, std = (int(x) for x in item.split(":"))
        if rank >= nproc:
            raise ConfigError(f"{option} {value!r}: local rank {rank} does not exist (nproc {nproc})")
        spec[rank] = std
    return spec


DEV = Path("/dev")
# device nodes of accelerators other than CUDA that torch.accelerator may count: Intel
# GPUs (XPU) and other DRM render nodes, the kernel's compute accelerators (Habana Gaudi
# and others), Huawei Ascend, AWS Neuron. A node with one of them only makes us ask torch.
ACCELERATOR_NODES = ("dri/renderD*", "accel/accel*", "davinci[0-9]*", "neuron[0-9]*")


def other_accelerators(dev: Path = DEV) -> bool:
    """Whether this node has a device node of an accelerator other than CUDA."""
    return any(next(dev.glob(pattern), None) is not None for pattern in ACCELERATOR_NODES)


def parse_nproc(value: str, environ: Mapping[str, str], python: str | None = None, dev: Path = DEV) -> int:
    """torchrun's --nproc-per-node. An integer, cpu, gpu and auto are read here; another
    device name (xpu, the PrivateUse1 backend's) only the ranks' torch can count: it is
    asked (``python``, the ranks' interpreter), once, as torchrun would. So is auto on a
    node with no CUDA device but another accelerator's device node (``dev``): torch's
    auto counts any accelerator, and the CPUs only where there is none."""
    value = value.strip()
    if re.fullmatch(r"\d+", value):
        n = int(value)
        if n < 1:
            raise ConfigError(f"--nproc-per-node {value}: must be at least 1")
        return n
    if value == "cpu":
        return len(os.sched_getaffinity(0))
    if value in ("gpu", "auto"):
        gpus = count_gpus(environ)
        if gpus:
            return gpus
        if value == "gpu":
            raise ConfigError("--nproc-per-node gpu: no CUDA device is visible on this node")
        if python is not None and other_accelerators(dev):
            return _torch_counts(value, python)  # torch's accelerator, or its CPU count
        return len(os.sched_getaffinity(0))
    if python is not None and re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", value):
        return _torch_counts(value, python)
    raise ConfigError(f"--nproc-per-node {value!r}: expected an integer, cpu, gpu, xpu or auto")


# torchrun's own count (determine_local_world_size), errors included, by the ranks' torch
_COUNT = """
import logging, sys
logging.disable(logging.CRITICAL)
try:
    from torch.distributed.run import determine_local_world_size
    print(determine_local_world_size(sys.argv[1]))
except Exception as exc:
    print(str(exc) or type(exc).__name__, file=sys.stderr)
    sys.exit(1)
"""


def _torch_counts(value: str, python: str) -> int:
    try:
        out = subprocess.run(
            [python, "-c", _COUNT, value], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"--nproc-per-node {value}: the ranks' torch counted nothing: {exc}") from None
    lines = (out.stdout if out.returncode == 0 else out.stderr).strip().splitlines()
    last = lines[-1] if lines else f"exit code {out.returncode}"
    if out.returncode != 0 or not last.isdigit() or int(last) < 1:
        if last.startswith("Unsupported nproc_per_node value"):  # not a device type torch knows
            raise ConfigError(f"--nproc-per-node {value!r}: expected an integer, cpu, gpu, xpu or auto")
        raise ConfigError(f"--nproc-per-node {value}: {last}")
    return int(last)


def count_gpus(environ: Mapping[str, str]) -> int:
    """CUDA devices visible to the ranks, without importing torch in the daemon."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    gpus = Path("/proc/driver/nvidia/gpus")
    return len(list(gpus.iterdir())) if gpus.is_dir() else 0


def parse_nnodes(value: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", value)
    if not m:
        raise ConfigError(f"--nnodes {value!r}: expected N or MIN:MAX")
    lo = int(m.group(1))
    hi = int(m.group(2)) if m.group(2) else lo
    if not 0 < lo <= hi:
        raise ConfigError(f"--nnodes {value!r}: need 0 < MIN <= MAX")
    return lo, hi


def parse_signals(value: str) -> tuple[int, ...]:
    out = []
    for raw in filter(None, (s.strip().upper() for s in value.split(","))):
        name = raw if raw.startswith("SIG") else "SIG" + raw
        try:
            out.append(int(getattr(signal.Signals, name)))
        except AttributeError:
            raise ConfigError(f"--signals-to-handle: unknown signal {name!r}") from None
    if not out:
        raise ConfigError("--signals-to-handle: expected a list such as SIGTERM,SIGINT")
    if signal.SIGKILL in out or signal.SIGSTOP in out:
        raise ConfigError("--signals-to-handle: SIGKILL and SIGSTOP cannot be handled")
    return tuple(out)


def parse_ranks_filter(value: str, nproc: int) -> frozenset[int] | None:
    if not value.strip():
        return None
    try:
        ranks = frozenset(int(x) for x in value.split(","))
    except ValueError:
        raise ConfigError(
            f"--local-ranks-filter {value!r}: expected comma-separated local ranks, e.g. 0,1,2"
        ) from None
    bad = sorted(r for r in ranks if not 0 <= r < nproc)
    if bad:
        raise ConfigError(f"--local-ranks-filter {value!r}: local rank(s) {bad} do not exist (nproc {nproc})")
    return ranks


# What a distributed torch script imports first. Not what DistributedDataParallel
# (and FSDP, torch.optim's first step, torch.compile) imports lazily, torch._dynamo and
# its 800 modules (about 1.4 s of a restart): with it, or with sympy and DTensor in its
# place, preloaded before the script, gloo's teardown deadlocked at exit far more often
# (issue 22: pytorch/examples' DDP tutorial with a SIGKILL, 7 of 21 runs with _dynamo,
# 2 of 12 with sympy, DTensor and FSDP, 0 of 32 with this list, as under torchrun).
TORCH_PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel")


def safe_name(name: str) -> str:
    """A run id as a single, harmless path component."""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return cleaned.strip(".") or "run"


def default_preload(python: str, current: str) -> tuple[str, ...]:
    # Only the rank's interpreter can tell whether torch is there; for our
    # own it costs a stat (importing it in the daemon would cost 200 MB).
    if python != current:
        return ()
    return TORCH_PRELOAD if importlib.util.find_spec("torch") is not None else ()


@dataclass(frozen=True, slots=True)
class RunConfig:
    program: Program
    topology: Topology
    max_restarts: int = 0
    run_id: str = "none"
    master_addr: str = "localhost"
    master_port: int | None = None  # None: a fresh free port every generation
    log_dir: Path = Path("ft-supervisor-logs")
    state_dir: Path = Path("ft-supervisor-logs/state")
    redirects: Mapping[int, int] | None = None
    tee: Mapping[int, int] | None = None
    local_ranks_filter: frozenset[int] | None = None
    shutdown_timeout: float = 30.0
    term_timeout: float | None = None  # the grace after a stop signal the daemon got; None: shutdown_timeout
    kill_timeout: float = 10.0
    exit_grace: float = 10.0
    save_timeout: float = 60.0  # the dying gasp: how long ranks with a save callback get to save
    finished_flag: Path | None = None  # FAULT_TOL_FINISHED_FLAG_FILE: training is complete when it exists
    autoresume: bool = False  # create finished_flag when the job completes
    mtbf: float | None = None  # a prior mean time between failures, for the advised checkpoint interval
    snapshot_memory: int | None = None  # bytes the ranks' snapshots may take; None: a quarter of RAM
    snapshot_replication_rate: int = 256 << 20  # bytes/s to the next node's daemon; 0: none
    stop_signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
    standby: bool = True
    fork_server: bool = True  # ranks forked from one process that preloaded (process/forkserver.py)
    cgroups: bool = True  # a cgroup per generation where one can be created
    virtual_local_rank: bool = False
    log_level: str = "info"
    log_format: str = "human"  # the console: human or json (log.FORMATS)
    ranks_torch: str | None = None  # the ranks' torch version (package metadata); None: none or unknown
    ft: FtConfig = field(default_factory=FtConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    rdzv: RdzvConfig | None = None  # None: a single node, no rendezvous
    hosting: HostingConfig = field(default_factory=HostingConfig)  # reload, forwarded signals
    metrics: MetricsConfig = field(default_factory=MetricsConfig)  # off unless --metrics-port
    checkpoint: CheckpointConfig | None = None  # None: no checkpoint sync
    health: HealthConfig = field(default_factory=HealthConfig)  # the node's ledger across runs
    stragglers: StragglerSettings = field(default_factory=StragglerSettings)  # --straggler-*
    numa_binding: str | None = None  # torchrun's --numa-binding mode, where it applies (GPUs, NUMA nodes)
    # torchrun's --duplicate-stdout-filters / --duplicate-stderr-filters
    duplicate_stdout: tuple[str, ...] = ()
    duplicate_stderr: tuple[str, ...] = ()
    # torchrun options given that have no effect here: (option and value, why)
    torchrun_ignored: tuple[tuple[str, str], ...] = ()

    def console_streams(self, local_rank: int) -> tuple[int, ...]:
        """Streams of a local rank shown on the console (torchrun's rules)."""
        if self.local_ranks_filter is not None and local_rank not in self.local_ranks_filter:
            return ()
        redirected = (self.redirects or {}).get(local_rank, STD_NONE)
        teed = (self.tee or {}).get(local_rank, STD_NONE)
        shown = []
        for stream, bit in ((STDOUT, STD_OUT), (STDERR, STD_ERR)):
            if not redirected & bit or teed & bit:
                shown.append(stream)
        return tuple(shown)

    def duplicate_filters(self, stream: int) -> tuple[str, ...]:
        """The strings whose lines of ``stream`` are copied to its filtered_*.log."""
        return self.duplicate_stdout if stream == STDOUT else self.duplicate_stderr

    @property
    def signals_to_handle(self) -> str:
        return ",".join(signal.Signals(s).name for s in self.stop_signals)
