"""Hang-detection settings, with nvidia-resiliency-ext's names and precedence.

Every setting comes from, highest first:
    the command line   --ft-rank-heartbeat-timeout 30   (or --ft-rank_heartbeat_timeout)
    the environment    FT_RANK_HEARTBEAT_TIMEOUT=30
    a config file      --ft-cfg-path FILE (or FAULT_TOL_CFG_PATH): YAML or TOML, whose
                       ``fault_tolerance`` section may sit anywhere in a larger document
    the defaults
so an ft_launcher command line or config file works unchanged: every option of
ft_launcher, in every spelling it has had (``--ft-x-y``, ``--ft-x_y``, ``--ft_x_y``,
``--ft-param-x_y``, ``--ignore-missing-fault-tol-cfg``), is accepted. The ones with
a meaning here are honoured; the others are reported once, with why, in the
``settings_ignored`` event. ``log_level`` is NVRx's own logging: the daemon's
console follows ``--log-level`` alone. With a config file, SIGHUP re-reads the
timeouts (``runtime/lifecycle/reload.py``). Every setting in seconds takes the one
duration syntax (``supervisor.config.durations``): ``90``, ``30s``, ``5m``, ``step:5m``.
"""

from __future__ import annotations

import argparse
import math
import re
import signal
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from supervisor.config import durations
from supervisor.config import files as configfile
from supervisor.config.errors import ConfigError
from supervisor.core.watch import Timeouts


def _timeout(value: object) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    return _seconds(value)


def _finite(value: object) -> float:
    if isinstance(value, bool):
        raise TypeError
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number):
        raise ValueError
    return number


def _at_least(minimum: float) -> Callable[[object], float]:
    def number(value: object) -> float:
        n = _finite(value)
        if n < minimum:
            raise ValueError
        return n

    return number


def _seconds(value: object) -> float:
    seconds = durations.parse(value)
    if seconds <= 0:
        raise ValueError
    return seconds


def _sections(value: object) -> dict[str, float | None]:
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, str):
        items = []
        for part in filter(None, (p.strip() for p in value.split(","))):
            name, sep, seconds = part.partition(":")
            if not sep:
                raise ValueError
            items.append((name, seconds))
    else:
        raise TypeError
    out: dict[str, float | None] = {}
    for name, seconds in items:
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][\w.-]*", name.strip()):
            raise ValueError
        out[name.strip()] = _timeout(seconds)
    return out


def _count(value: object) -> int:
    if isinstance(value, bool):
        raise TypeError
    if isinstance(value, int):
        n = value
    elif (isinstance(value, float) and value.is_integer()) or (
        isinstance(value, str) and value.strip().isdigit()
    ):
        n = int(value)
    else:
        raise ValueError
    if n < 0:
        raise ValueError
    return n


def _integer(value: object) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError
    return int(str(value).strip()) if isinstance(value, str) else int(value)  # type: ignore[call-overload]


def _positive_count(value: object) -> int:
    n = _count(value)
    if n < 1:
        raise ValueError
    return n


def _flag(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError


def _exit_code(value: object) -> int:
    code = _integer(value)
    if not 1 <= code <= 255:
        raise ValueError
    return code


def _signal(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return int(signal.Signals(value))
    name = str(value).strip().upper()
    name = name if name.startswith("SIG") else "SIG" + name
    return int(signal.Signals[name])


@dataclass(frozen=True, slots=True)
class _Key:
    parse: Callable[[object], Any]
    form: str


_SECONDS = "a duration (90, 30s, 5m, 2h)"

KEYS: dict[str, _Key] = {
    "initial_rank_heartbeat_timeout": _Key(_timeout, f"{_SECONDS} > 0, or none"),
    "rank_heartbeat_timeout": _Key(_timeout, f"{_SECONDS} > 0, or none"),
    "rank_section_timeouts": _Key(
        _sections, "NAME:DURATION,... such as setup:600,step:3m (none: no timeout)"
    ),
    "rank_out_of_section_timeout": _Key(_timeout, f"{_SECONDS} > 0, or none"),
    "num_warmup_iterations": _Key(_count, "an integer >= 0"),
    "safety_factor": _Key(_at_least(1.0), "a number >= 1"),
    "rank_termination_signal": _Key(_signal, "a signal name such as SIGKILL, or its number"),
    "learn_timeouts": _Key(_flag, "true or false"),
    "learned_timeout_floor": _Key(_seconds, f"{_SECONDS} > 0"),
    "stack_dump_timeout": _Key(_seconds, f"{_SECONDS} > 0"),
    "bundle_timeout": _Key(durations.parse, f"{_SECONDS} >= 0 (0: Python stacks only)"),
    # the crash-loop guard (nvidia-resiliency-ext's progress tracker)
    "max_no_progress_cycles": _Key(_integer, "an integer (0 or less: never abort for lack of progress)"),
    "min_progress_iterations": _Key(_positive_count, "an integer >= 1"),
    # ft_launcher's "do not requeue" code: our abort's exit code unless --abort-exit-code
    "no_restart_exit_code": _Key(_exit_code, "an exit code, 1-255"),
}

# --ft-restart-policy's values: any-failed is what happens here
RESTART_POLICIES = ("any-failed", "min-healthy")

_LOGS = "the ranks' output is kept per generation under --log-dir, and the daemon's on its console"
_NIC = "NICs are not monitored; a NIC or link failure is classified from the ranks' logs"
_GPU_MEMORY = "a generation's processes are all ended and reaped before the next starts"
_ATTRIBUTION = "failures are attributed by ft-supervisor's own rules (see `ft-supervisor classify`)"
_CYCLES = "each generation is recorded in the run directory's events.jsonl and reason.json"

# nvidia-resiliency-ext settings (config fields and ft_launcher --ft-* options)
# that have no meaning here: accepted so that existing configs and command lines
# work, and reported once as ignored, with why.
IGNORED: dict[str, str] = {
    "workload_check_interval": "each deadline arms its own timer: nothing polls",
    "node_health_check_interval": "no node health-check service is polled; hardware failures are "
    "classified from logs and kept in the node health ledger",
    "node_health_check_endpoint": "no node health-check service is polled",
    "restart_check_interval": "a restart is decided when a failure is seen, not polled for",
    "enable_nic_monitor": _NIC, "enable_nic_healthcheck": _NIC, "pci_topo_file": _NIC,
    "link_down_path_template": _NIC, "link_state_path_template": _NIC,
    "enable_dist_storage_healthcheck": "no storage health check runs before a restart",
    "storage_healthcheck_path": "no storage health check runs before a restart",
    "skip_section_response": "the ranks' section messages never wait for a reply here",
    "segment": "hot-spare segments are NVRx's rendezvous; spare nodes wait with --nnodes MIN:MAX",
    "use_infra_group_rank": "a node's rank comes from --node-rank or from the rendezvous",
    "rdzv_impl": "the rendezvous is --rdzv-backend's",
    "numa_bind_strict": "NUMA binding is torchrun's --numa-binding",
    "gpu_memory_reclaim_timeout": _GPU_MEMORY, "gpu_memory_tolerance_mb": _GPU_MEMORY,
    "gpu_memory_poll_interval": _GPU_MEMORY,
    "check_remaining_processes": "a generation's leftover processes are always swept (cgroup or "
    "process groups)",
    "checkpoint_iteration_file": "progress is the iterations the ranks report (heartbeats, steps)",
    "install_exception_hook": "an uncaught exception is read from the rank's error file and log",
    "attribution_endpoint": _ATTRIBUTION, "attribution_startup_timeout": _ATTRIBUTION,
    "attribution_llm_api_key_file": _ATTRIBUTION, "attribution_llm_base_url": _ATTRIBUTION,
    "attribution_llm_model": _ATTRIBUTION, "attribution_analysis_backend": _ATTRIBUTION,
    "attribution_stop_action": _ATTRIBUTION, "attribution_log_level": _ATTRIBUTION,
    "attribution_export_url": _ATTRIBUTION, "attribution_compute_timeout": _ATTRIBUTION,
    "cycle_info_dir": _CYCLES, "cycle_info_job_id": _CYCLES,
    "per_cycle_applog_prefix": _LOGS, "nvrx_logfile": _LOGS, "enable_log_server": _LOGS,
    "log_server_port": _LOGS, "log_aggregator_count": _LOGS, "log_leaf_max_queue_chunks": _LOGS,
    "log_server_log_prefix": _LOGS, "log_server_graceful_shutdown_timeout": _LOGS,
    "log_level": "NVRx's own logging; the daemon's console follows --log-level",
}  # fmt: skip
MIN_HEALTHY = "a failure restarts every rank of the job here (any-failed); min-healthy is not supported"
UNKNOWN = "not a setting ft-supervisor knows (nvidia-resiliency-ext ignores unknown keys too)"
# spellings ft_launcher gave a setting besides the ones made from its name
ALIASES: dict[str, tuple[str, ...]] = {
    "storage_healthcheck_path": ("--ft-storage-health-check-path", "--ft_storage_health_check_path"),
    "restart_policy": ("--restart-policy", "--restart_policy"),
}


@dataclass(frozen=True, slots=True)
class FtConfig:
    initial_rank_heartbeat_timeout: float | None = None
    rank_heartbeat_timeout: float | None = None
    rank_section_timeouts: Mapping[str, float | None] = field(default_factory=dict)
    rank_out_of_section_timeout: float | None = None
    num_warmup_iterations: int = 5
    safety_factor: float = 5.0
    rank_termination_signal: int = int(signal.SIGKILL)
    learn_timeouts: bool = True
    learned_timeout_floor: float = 10.0
    stack_dump_timeout: float = 2.0
    # the hang's diagnostic bundle: native stacks and NCCL's Flight Recorder, before the kill
    bundle_timeout: float = 10.0
    max_no_progress_cycles: int = 3
    min_progress_iterations: int = 1
    no_restart_exit_code: int | None = None  # None: --abort-exit-code's
    # settings given that have no effect here: (the setting as given, why), in order
    ignored: tuple[tuple[str, str], ...] = ()

    def timeouts(self) -> Timeouts:
        return Timeouts(
            initial_heartbeat=self.initial_rank_heartbeat_timeout,
            heartbeat=self.rank_heartbeat_timeout,
            sections=dict(self.rank_section_timeouts),
            out_of_section=self.rank_out_of_section_timeout,
            warmup_iterations=self.num_warmup_iterations,
            learned_floor=self.learned_timeout_floor,
        )

    @property
    def monitors_anything(self) -> bool:
        t = self.timeouts()
        return bool(t.sections) or any(
            v is not None for v in (t.initial_heartbeat, t.heartbeat, t.out_of_section)
        )


def _shown(value: object, limit: int = 80) -> str:
    """``value`` as an error quotes it: one from a file may be a megabyte long."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _check(where: str, key: str, value: object) -> Any:
    spec = KEYS[key]
    try:
        return spec.parse(value)
    except (ValueError, TypeError, KeyError, OverflowError):
        raise ConfigError(f"{where} {_shown(value)}: expected {spec.form}") from None


def _find_section(doc: object) -> Mapping[str, Any] | None:
    """The first ``fault_tolerance`` mapping anywhere in a document (breadth first).

    Each container is looked at once: a document that holds itself, or the same
    list a billion times over, is walked in time linear in its distinct parts
    (``configfile`` refuses such documents already; this does not rely on it).
    """
    queue: deque[object] = deque([doc])
    seen: set[int] = set()
    while queue:
        node = queue.popleft()
        if not isinstance(node, Mapping | list) or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, Mapping):
            ft = node.get("fault_tolerance")
            if isinstance(ft, Mapping):
                return ft
            queue.extend(node.values())
        else:
            queue.extend(node)
    return None


def read_file(path: Path) -> Mapping[str, Any]:
    """The ``fault_tolerance`` section of a YAML or TOML file, read within
    ``configfile``'s bounds; every problem is an ``ConfigError`` of one line."""
    try:
        doc = configfile.read(path, "toml" if path.suffix == ".toml" else "yaml")
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    section = _find_section(doc)
    if section is None:
        raise ConfigError(f"config file {path}: no 'fault_tolerance' section")
    return section


SETTINGS = (*KEYS, "restart_policy", *IGNORED)  # every setting a config, FT_* or --ft-* may give


def env_settings(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: environ[f"FT_{k.upper()}"] for k in SETTINGS if f"FT_{k.upper()}" in environ}


def _restart_policy(where: str, value: object) -> str | None:
    """Why ``--ft-restart-policy`` is ignored, or None where it is what happens here."""
    policy = str(value).strip().lower()
    if policy not in RESTART_POLICIES:
        raise ConfigError(f"{where} {_shown(value)}: expected {' or '.join(RESTART_POLICIES)}")
    return MIN_HEALTHY if policy == "min-healthy" else None


def _normalise(key: object) -> str:
    # str(): a YAML key may be a number, a date or null
    return str(key).strip().replace("-", "_").lower()


def load(
    cli: Mapping[str, object],
    environ: Mapping[str, str],
    file: Path | None,
) -> FtConfig:
    """Merge defaults < file < environment < command line, validating every value.

    Errors name the setting as the user wrote it: ``--ft-...``, ``FT_...`` or
    ``FILE: key``.
    """
    if file is None and "FAULT_TOL_CFG_PATH" in environ:
        file = Path(environ["FAULT_TOL_CFG_PATH"])
    layers: list[tuple[Mapping[str, object], Callable[[str], str], bool]] = []
    if file is not None:
        # unknown keys in a file are ignored, as nvidia-resiliency-ext does
        layers.append((read_file(file), lambda k: f"{file}: {k}", True))
    layers.append((env_settings(environ), lambda k: f"FT_{k.upper()}", False))
    layers.append((cli, lambda k: f"--ft-{k.replace('_', '-')}", False))
    values: dict[str, Any] = {}
    ignored: dict[str, tuple[str, str]] = {}  # per setting, the last layer's spelling
    for layer, name, lenient in layers:
        for raw_key, value in layer.items():
            key = _normalise(raw_key)
            if key in KEYS:
                values[key] = _check(name(key), key, value)
                ignored.pop(key, None)
            elif key == "restart_policy":
                why = _restart_policy(name(key), value)
                if why is None:
                    ignored.pop(key, None)
                else:
                    ignored[key] = (f"{name(key)} {value}", why)
            elif key in IGNORED:
                ignored[key] = (name(key), IGNORED[key])
            elif lenient:
                ignored[key] = (name(key), UNKNOWN)
            else:
                raise ConfigError(f"{name(key)}: unknown fault-tolerance setting")
    names = {f.name for f in fields(FtConfig)}
    return FtConfig(**{k: v for k, v in values.items() if k in names}, ignored=tuple(ignored.values()))


def spellings(key: str) -> list[str]:
    """Every spelling ft_launcher has given ``--ft-<key>`` over time: dashes or
    underscores after ``--ft-`` (or ``--ft_``), and the older ``--ft-param-`` prefix."""
    dashed = key.replace("_", "-")
    made = [f"--ft-{dashed}", f"--ft-{key}", f"--ft_{key}", f"--ft-param-{key}", f"--ft-param-{dashed}",
            f"--ft_param_{key}"]  # fmt: skip
    return list(dict.fromkeys([*made, *ALIASES.get(key, ())]))


def add_options(group: Any) -> None:
    group.add_argument(
        "--ft-cfg-path",
        "--ft-cfg_path",
        "--ft_cfg_path",
        "--fault-tol-cfg-path",
        dest="ft_cfg_path",
        default=None,
        help="YAML or TOML file with a fault_tolerance section (also FAULT_TOL_CFG_PATH)",
    )
    group.add_argument(
        "--ft-ignore-missing-cfg",
        "--ft-ignore_missing_cfg",
        "--ft_ignore_missing_cfg",
        "--ignore-missing-fault-tol-cfg",
        dest="ft_ignore_missing_cfg",
        action="store_true",
        # what ft_launcher does with it is what happens here anyway: no config, the defaults
        help=argparse.SUPPRESS,
    )
    helps = {
        "initial_rank_heartbeat_timeout": "how long from the client's init to its first heartbeat (90, 5m)",
        "rank_heartbeat_timeout": "how long between two heartbeats (90, 5m)",
        "rank_section_timeouts": "per-section timeouts: setup:10m,step:180,checkpointing:7m",
        "rank_out_of_section_timeout": "how long outside any section (90, 5m)",
        "num_warmup_iterations": "first step iterations not held to the step timeout (default 5)",
        "safety_factor": "learned timeout = observed maximum x this (default 5)",
        "rank_termination_signal": "signal for a hung rank (default SIGKILL)",
        "learn_timeouts": "learn timeouts from what the ranks do (default true)",
        "learned_timeout_floor": "a learned timeout in force is never shorter than this (default 10s)",
        "stack_dump_timeout": "how long to wait for a hung rank's stack dump (default 2s)",
        "bundle_timeout": "how long a hang's diagnostic bundle (native stacks with py-spy, NCCL's Flight "
        "Recorder) may delay the kill (default 10s; 0: none)",
        "max_no_progress_cycles": "abort after this many restarts in a row without progress (default 3; "
        "0: never)",
        "min_progress_iterations": "iterations a generation must advance to count as progress (default 1)",
        "no_restart_exit_code": "ft_launcher's name for --abort-exit-code (which wins when both are given)",
        "restart_policy": "any-failed (what happens here; min-healthy is accepted and ignored)",
    }
    for key in SETTINGS:
        group.add_argument(
            *spellings(key), dest=f"ft_{key}", default=None, metavar="VALUE",
            help=helps.get(key, argparse.SUPPRESS),
        )  # fmt: skip


def cli_settings(ns: Any) -> dict[str, object]:
    """The ``--ft-*`` settings the command line gave."""
    return {key: getattr(ns, f"ft_{key}") for key in SETTINGS if getattr(ns, f"ft_{key}") is not None}


def from_namespace(ns: Any, environ: Mapping[str, str]) -> FtConfig:
    return load(cli_settings(ns), environ, Path(ns.ft_cfg_path) if ns.ft_cfg_path else None)
