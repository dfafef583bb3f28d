"""The ``--ft-*`` options of the command line, in every spelling ft_launcher has had, and
the settings a parsed command line gave.
"""

from __future__ import annotations

import argparse
from typing import Any

from supervisor.config.ft_settings import SETTINGS

# spellings ft_launcher gave a setting besides the ones made from its name
ALIASES: dict[str, tuple[str, ...]] = {
    "storage_healthcheck_path": ("--ft-storage-health-check-path", "--ft_storage_health_check_path"),
    "restart_policy": ("--restart-policy", "--restart_policy"),
}


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
