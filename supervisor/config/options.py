"""Every option of ``ft-supervisor run``: torchrun's, with both spellings
(``--nproc-per-node`` and ``--nproc_per_node``) and torchrun's ``PET_<NAME>``
environment defaults, then ours, group by group. Declaring them is all this
module does; turning them into a RunConfig is supervisor.config.build's job.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from supervisor.config import (
    checkpoints,
    durations,
    ft,
    health,
    hosting,
    memory,
    metrics,
    policy,
    stragglers,
    torchrun,
)
from supervisor.config.run import DEFAULT_SIGNALS

FINISHED_FLAG_ENV = "FAULT_TOL_FINISHED_FLAG_FILE"  # nvidia-resiliency-ext's auto-resume contract

# What `run --help` shows: what a torchrun user sets, and the handful of ours
# that change what the daemon decides. `--help-all` shows every option.
ESSENTIAL = frozenset(
    {
        "nnodes", "nproc_per_node", "node_rank", "standalone", "rdzv_backend", "rdzv_endpoint", "rdzv_id",
        "max_restarts", "module", "log_dir", "master_addr", "master_port",
        "ft_cfg_path", "ft_rank_heartbeat_timeout", "ft_rank_section_timeouts",
        "policy_preset", "rules", "reschedule_exit_code", "abort_exit_code",
        "checkpoint_path", "checkpoint_url", "metrics_port", "no_standby", "log_level", "node_quarantine",
        "straggler_action", "training_script", "training_script_args", "help", "help_all",
    }
)  # fmt: skip


def _opt(group: Any, *names: str, **kw: Any) -> None:
    """Add an option the torchrun way: underscore aliases and PET_* defaults."""
    aliases = ["--" + n[2:].replace("-", "_") for n in names if n.startswith("--") and "-" in n[2:]]
    action = group.add_argument(*names, *aliases, **kw)
    pet = os.environ.get(f"PET_{action.dest.upper()}")
    if pet is not None:
        if action.nargs == 0:  # a flag: torchrun's check_env accepts 1/true/yes
            action.default = pet.strip().lower() in ("1", "true", "yes", "on")
        else:
            action.default = pet


class _HelpAll(argparse.Action):
    """``--help-all``: the help with every option, the ones `--help` leaves out included."""

    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any, **__: Any) -> None:
        for action in parser._actions:
            action.help = getattr(action, "full_help", action.help)
        parser.epilog = None
        parser.print_help()
        parser.exit()


def hide_the_rest(p: argparse.ArgumentParser) -> int:
    """Leave all but the essential options out of ``--help``; how many were left out."""
    hidden = 0
    for action in p._actions:
        if action.dest in ESSENTIAL or action.help == argparse.SUPPRESS:
            continue
        action.full_help = action.help  # type: ignore[attr-defined]
        action.help = argparse.SUPPRESS
        hidden += 1
    return hidden


def add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--help-all", action=_HelpAll, help="show every option, not only the essential ones")
    g = p.add_argument_group("torchrun options")
    found = torchrun.installed(os.environ.get("PYTHON_EXEC", sys.executable), os.environ)
    torchrun.add_options(g, found.options, _ours())
    _opt(g, "--run-id", default=None, help="alias of --rdzv-id")
    p.set_defaults(torchrun_options=found)
    add_supervisor_options(p.add_argument_group("ft-supervisor options"))
    ft.add_options(p.add_argument_group("hang detection (nvidia-resiliency-ext --ft-* names)"))
    policy.add_options(p.add_argument_group("failure policy: exit codes, rules, plugins"))
    metrics.add_options(p.add_argument_group("metrics: an optional Prometheus endpoint"))
    hosting.add_options(p.add_argument_group("service: systemd, container entrypoint"))
    checkpoints.add_options(p.add_argument_group("checkpoint sync: LOCAL to DEST, copy-back at start"))
    health.add_options(p.add_argument_group("node health: a ledger across runs, and quarantine"))
    stragglers.add_options(p.add_argument_group("stragglers: ranks slower than the node's others"))


def _ours() -> dict[str, dict[str, Any]]:
    """Our help for torchrun's options, and where our meaning differs from torch's
    declaration, our default, type or action (torch's defaults are used otherwise)."""
    return {
        "nnodes": {"help": "number of nodes, N or MIN:MAX (a node beyond MAX waits as a spare)"},
        "nproc_per_node": {"help": "ranks on this node: an integer, cpu, gpu, xpu or auto"},
        "node_rank": {"help": "rank of this node (static backend; others assign it)"},
        "standalone": {"help": "single-node run with a local store on a free port"},
        "rdzv_backend": {"help": "rendezvous backend: c10d, static, etcd-v2 (or etcd, run as etcd-v2)"},
        "rdzv_endpoint": {"help": "rendezvous endpoint HOST:PORT"},
        # None: not given (torch's "none"), so that --run-id can say it instead
        "rdzv_id": {"default": None, "help": "run id (TORCHELASTIC_RUN_ID); default: a fresh uuid"},
        "rdzv_conf": {
            "help": "rendezvous configuration key=value,...: join_timeout, last_call_timeout, "
            "close_timeout, keep_alive_interval, keep_alive_max_attempt, is_host, read_timeout"
        },
        "max_restarts": {"help": "restarts allowed to the whole job before failing"},
        "monitor_interval": {
            "type": durations.duration,
            "help": "accepted and ignored: exits are noticed at once",
        },
        "start_method": {
            "help": "accepted and ignored: ranks are forked from ft-supervisor's fork server "
            "(or spawned through its bootstrap: --no-fork-server)"
        },
        "event_log_handler": {"help": "accepted and ignored: the run's events go to its events.jsonl"},
        "role": {"help": "role name of the ranks (ROLE_NAME)"},
        "module": {"help": "run SCRIPT as a module, like python -m"},
        "no_python": {"help": "exec SCRIPT directly instead of with python"},
        "run_path": {"help": "run SCRIPT as __main__ in the rank's interpreter (over --no-python)"},
        "log_dir": {"help": "base directory for logs (default ./ft-supervisor-logs)"},
        "redirects": {"help": "streams shown only in the log files: 0-3 or 0:1,1:2"},
        "tee": {"help": "streams written to the log files and the console"},
        "local_ranks_filter": {"help": "only show these local ranks on the console"},
        "duplicate_stdout_filters": {
            "help": "copy the ranks' stdout lines shown on the console that contain one of these "
            "comma-separated strings to filtered_stdout.log in each generation's directory (',,' is a comma)"
        },
        "duplicate_stderr_filters": {"help": "the same for stderr, to filtered_stderr.log"},
        "master_addr": {"default": None, "help": "address of rank 0 (MASTER_ADDR)"},
        "master_port": {"help": "port of rank 0's store; default: a fresh free port every generation"},
        "local_addr": {"help": "address of this node"},
        "logs_specs": {"help": "accepted and reported: each rank's output goes to its own log files"},
        "numa_binding": {"help": "bind each rank's CPUs to its GPU's NUMA node (torch's modes)"},
        "signals_to_handle": {
            "default": DEFAULT_SIGNALS,
            "action": hosting.StoreGiven,
            "help": "signals that stop the run (SIGHUP reloads instead when there is a config file)",
        },
        "shutdown_timeout": {
            "type": durations.duration,
            # a string: argparse converts (and checks) it as it would a given value
            "default": os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"),
            "help": "seconds between SIGTERM and SIGKILL when stopping ranks",
        },
        "virtual_local_rank": {"help": "LOCAL_RANK=0 for every rank, each seeing only its own device"},
    }


def add_supervisor_options(f: Any) -> None:
    """Ours: how ranks are stopped, started and held, and where the run's files go."""
    _opt(
        f,
        "--kill-timeout",
        type=durations.duration,
        default=10.0,
        help="seconds to wait after SIGKILL before reporting a rank as stuck in the kernel",
    )
    _opt(
        f,
        "--exit-grace",
        type=durations.duration,
        default=10.0,
        help="seconds a rank that reported its failure (error file, client), or that still runs "
        "after every other rank exited 0, may take to exit before it is killed",
    )
    _opt(
        f,
        "--save-timeout",
        type=durations.duration,
        default=60.0,
        help="before ranks are stopped (a failure, a restart, SIGTERM), ranks that registered a save "
        "callback are asked to save and get this many seconds; 0 disables it",
    )
    _opt(
        f,
        "--finished-flag-file",
        default=os.environ.get(FINISHED_FLAG_ENV) or None,
        help=f"training is complete when this file exists: the run exits 0 at once (default "
        f"${FINISHED_FLAG_ENV}); ranks get it in {FINISHED_FLAG_ENV}",
    )
    _opt(
        f,
        "--autoresume",
        action="store_true",
        help="create the finished-flag file when the job completes, for an outer auto-resume loop",
    )
    _opt(
        f,
        "--no-standby",
        action="store_true",
        help="do not pre-start the next generation's ranks (saves memory, slower restarts)",
    )
    _opt(
        f,
        "--no-cgroups",
        action="store_true",
        help="hold a generation's descendants by process groups, PDEATHSIG and the token sweep "
        "only, even where a cgroup per generation could be created (docs: guides/production.md)",
    )
    _opt(
        f,
        "--preload",
        default="auto",
        help="modules a rank imports before its generation starts: auto (torch when "
        "installed), none, or a comma-separated list",
    )
    _opt(
        f,
        "--no-fork-server",
        action="store_true",
        help="spawn every rank afresh, each importing the preload itself, instead of forking it "
        "from one process that imported it once (docs: guides/standbys.md)",
    )
    _opt(
        f,
        "--no-fast-exit",
        action="store_true",
        help="let ranks run CPython's full garbage collection at exit (0.4-0.7 s with torch)",
    )
    _opt(
        f,
        "--mtbf",
        type=durations.duration,
        default=None,
        help="a prior for the mean time between failures, in seconds of training: the advised "
        "checkpoint interval starts from it before the run has failed, and moves towards "
        "what is measured as failures come",
    )
    _opt(
        f,
        "--snapshot-memory",
        default=memory.DEFAULT,
        help="the most memory the ranks' snapshots (client.snapshot) may take in /dev/shm, all "
        "slots together: bytes (512M, 2G) or a fraction of the node's memory (default 0.25; 0: "
        "none); never more than /dev/shm's free space. A snapshot beyond it is refused, training goes on",
    )
    _opt(
        f,
        "--snapshot-replication-rate",
        default=memory.REPLICATION_DEFAULT,
        help="multi-node: the most bytes a second this node's daemon sends of its ranks' snapshots to the "
        "next node's, which keeps them (within its --snapshot-memory) for a node that is lost and "
        "replaced: 256M (the default: a tenth of a 25 Gb/s link, left to the training's own traffic, "
        "a 100 MB snapshot replicated in 0.4 s), 1G, 0 (none)",
    )
    _opt(f, "--log-level", default="info", choices=["debug", "info", "warning", "error"],
         action=hosting.StoreGiven, help="the daemon's log level (default info)")  # fmt: skip
    _opt(f, "--log-format", default="human", choices=["human", "json"],
         help="the console: human (a sentence per event, the ranks' lines under [rank N]) or json "
         "(one JSON object per line, for log shippers); the event log file is JSON either way")  # fmt: skip
    _opt(
        f,
        "--state-dir",
        default=None,
        help="where learned timeouts persist (default <log-dir>/<run id>/state)",
    )
    # ft_launcher's names for its two stop timeouts
    _opt(
        f,
        "--workers-stop-timeout",
        type=durations.duration,
        default=None,
        help="ft_launcher's name for --shutdown-timeout (when both are given, this one)",
    )
    _opt(
        f,
        "--term-timeout",
        type=durations.duration,
        default=None,
        help="seconds between SIGTERM and SIGKILL when the daemon itself got a stop signal and passes "
        "it on to the ranks (ft_launcher's option; default: --shutdown-timeout)",
    )


