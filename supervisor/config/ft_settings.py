"""Every fault-tolerance setting nvidia-resiliency-ext has, as ft-supervisor takes it:
those with a meaning here (``KEYS``: how each value is read, and the form an error
asks for) and those without (``IGNORED``: accepted, and reported once with why).
``supervisor.config.ft`` merges them into an ``FtConfig``.
"""

from __future__ import annotations

import math
import re
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.config import durations


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

SETTINGS = (*KEYS, "restart_policy", *IGNORED)  # every setting a config, FT_* or --ft-* may give
