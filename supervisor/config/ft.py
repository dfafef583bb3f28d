"""Hang-detection settings, with nvidia-resiliency-ext's names and precedence.

Every setting comes from, highest first:
    the command line   --ft-rank-heartbeat-timeout 30   (or --ft-rank_heartbeat_timeout)
    the environment    FT_RANK_HEARTBEAT_TIMEOUT=30
    a config file      --ft-cfg-path FILE (or FAULT_TOL_CFG_PATH): YAML or TOML, whose
                       ``fault_tolerance`` section may sit anywhere in a larger document
    the defaults
so an ft_launcher command line or config file works unchanged. Options of
ft_launcher that do not apply here are accepted and reported as ignored.
``log_level`` sets the daemon's log level unless ``--log-level`` is given; with a
config file, SIGHUP re-reads the timeouts and the log level (``runtime/reload.py``).
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

from supervisor.config import files as configfile
from supervisor.config.errors import ConfigError
from supervisor.core.watch import Timeouts


def _timeout(value: object) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    if isinstance(value, bool):
        raise TypeError
    seconds = float(value)  # type: ignore[arg-type]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError
    return seconds


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
    seconds = _timeout(value)
    if seconds is None:
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


LOG_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


def _log_level(value: object) -> str:
    """nvidia-resiliency-ext's log_level: a name (any case) or logging's number."""
    if isinstance(value, bool):
        raise TypeError
    name = str(value).strip().lower()
    if name.isdigit():
        return {number: level for level, number in LOG_LEVELS.items()}[int(name)]
    name = "warning" if name == "warn" else name
    if name not in LOG_LEVELS:
        raise ValueError
    return name


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


KEYS: dict[str, _Key] = {
    "initial_rank_heartbeat_timeout": _Key(_timeout, "seconds > 0, or none"),
    "rank_heartbeat_timeout": _Key(_timeout, "seconds > 0, or none"),
    "rank_section_timeouts": _Key(
        _sections, "NAME:SECONDS,... such as setup:600,step:180 (none: no timeout)"
    ),
    "rank_out_of_section_timeout": _Key(_timeout, "seconds > 0, or none"),
    "num_warmup_iterations": _Key(_count, "an integer >= 0"),
    "safety_factor": _Key(_at_least(1.0), "a number >= 1"),
    "rank_termination_signal": _Key(_signal, "a signal name such as SIGKILL, or its number"),
    "learn_timeouts": _Key(_flag, "true or false"),
    "learned_timeout_floor": _Key(_seconds, "seconds > 0"),
    "stack_dump_timeout": _Key(_seconds, "seconds > 0"),
    "bundle_timeout": _Key(_at_least(0.0), "seconds >= 0 (0: Python stacks only)"),
    # the crash-loop guard (nvidia-resiliency-ext's progress tracker)
    "max_no_progress_cycles": _Key(_integer, "an integer (0 or less: never abort for lack of progress)"),
    "min_progress_iterations": _Key(_positive_count, "an integer >= 1"),
    # the daemon's log level; SIGHUP re-reads it from the file (--log-level outranks it)
    "log_level": _Key(_log_level, "debug, info, warning, error or critical (or 10-50)"),
}

# nvidia-resiliency-ext settings (config fields and ft_launcher --ft-* options)
# that have no meaning here: accepted so that existing configs and command lines
# work, and reported as ignored.
IGNORED = frozenset(
    {
        "workload_check_interval",  # we arm a timer per deadline instead of polling
        "node_health_check_interval", "restart_check_interval", "enable_nic_monitor",
        "enable_nic_healthcheck", "enable_dist_storage_healthcheck", "storage_healthcheck_path",
        "pci_topo_file", "link_down_path_template", "link_state_path_template",
        "skip_section_response",  # our sends never wait for a reply
        "segment", "numa_bind_strict", "gpu_memory_reclaim_timeout", "gpu_memory_tolerance_mb",
        "gpu_memory_poll_interval", "check_remaining_processes",
        "checkpoint_iteration_file", "install_exception_hook",
        "attribution_endpoint", "attribution_stop_action", "attribution_export_url",
        "cycle_info_dir", "rdzv_impl", "restart_policy", "node_health_check_endpoint",
        "no_restart_exit_code", "per_cycle_applog_prefix", "nvrx_logfile", "enable_log_server",
        "log_server_port", "log_aggregator_count", "attribution_llm_key_file",
        "attribution_llm_base_url", "attribution_llm_model", "attribution_backend",
        "attribution_startup_timeout", "ignore_missing_cfg",
    }
)  # fmt: skip


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
    log_level: str | None = None  # None: --log-level's (info by default)
    ignored: tuple[str, ...] = ()  # settings given that have no effect here

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


def env_settings(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: environ[f"FT_{k.upper()}"] for k in (*KEYS, *IGNORED) if f"FT_{k.upper()}" in environ}


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
    ignored: set[str] = set()
    for layer, name, lenient in layers:
        for raw_key, value in layer.items():
            key = _normalise(raw_key)
            if key in KEYS:
                values[key] = _check(name(key), key, value)
            elif key in IGNORED or lenient:
                ignored.add(key)
            else:
                raise ConfigError(f"{name(key)}: unknown fault-tolerance setting")
    names = {f.name for f in fields(FtConfig)}
    return FtConfig(**{k: v for k, v in values.items() if k in names}, ignored=tuple(sorted(ignored)))


def add_options(group: Any) -> None:
    """``--ft-<setting>`` in every spelling ft_launcher has accepted over time:
    dashes or underscores after ``--ft-``, and the older ``--ft-param-`` prefix."""
    group.add_argument(
        "--ft-cfg-path",
        "--ft_cfg_path",
        "--fault-tol-cfg-path",
        dest="ft_cfg_path",
        default=None,
        help="YAML or TOML file with a fault_tolerance section (also FAULT_TOL_CFG_PATH)",
    )
    helps = {
        "initial_rank_heartbeat_timeout": "seconds from the client's init to its first heartbeat",
        "rank_heartbeat_timeout": "seconds between two heartbeats",
        "rank_section_timeouts": "per-section timeouts: setup:600,step:180,checkpointing:420",
        "rank_out_of_section_timeout": "seconds outside any section",
        "num_warmup_iterations": "first step iterations not held to the step timeout (default 5)",
        "safety_factor": "learned timeout = observed maximum x this (default 5)",
        "rank_termination_signal": "signal for a hung rank (default SIGKILL)",
        "learn_timeouts": "learn timeouts from what the ranks do (default true)",
        "learned_timeout_floor": "a learned timeout in force is never shorter than this (default 10 s)",
        "stack_dump_timeout": "seconds to wait for a hung rank's stack dump (default 2)",
        "bundle_timeout": "seconds a hang's diagnostic bundle (native stacks with py-spy, NCCL's Flight "
        "Recorder) may delay the kill (default 10; 0: none)",
        "max_no_progress_cycles": "abort after this many restarts in a row without progress (default 3; "
        "0: never)",
        "min_progress_iterations": "iterations a generation must advance to count as progress (default 1)",
        "log_level": "the daemon's log level when --log-level is not given (a SIGHUP re-reads the file's)",
    }
    for key in (*KEYS, *sorted(IGNORED)):
        dashed = key.replace("_", "-")
        names = dict.fromkeys([f"--ft-{dashed}", f"--ft-{key}", f"--ft-param-{key}", f"--ft-param-{dashed}"])
        group.add_argument(
            *names, dest=f"ft_{key}", default=None, metavar="VALUE",
            help=helps.get(key, argparse.SUPPRESS),
        )  # fmt: skip


def from_namespace(ns: Any, environ: Mapping[str, str]) -> FtConfig:
    cli = {key: getattr(ns, f"ft_{key}") for key in (*KEYS, *IGNORED) if getattr(ns, f"ft_{key}") is not None}
    return load(cli, environ, Path(ns.ft_cfg_path) if ns.ft_cfg_path else None)
