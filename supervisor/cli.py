"""Command line: ``ft-supervisor run [torchrun options] SCRIPT [ARGS...]``.

Every torchrun option a single-node user passes is accepted, with both
spellings (``--nproc-per-node`` and ``--nproc_per_node``) and torchrun's
``PET_<NAME>`` environment defaults, so replacing ``torchrun`` with
``ft-supervisor run`` is the whole migration.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from supervisor import checkpointconfig, ftconfig, hostingconfig, metricsconfig, policyconfig
from supervisor.config import (
    DEFAULT_SIGNALS,
    ConfigError,
    RunConfig,
    default_preload,
    parse_nnodes,
    parse_nproc,
    parse_ranks_filter,
    parse_signals,
    parse_std,
    safe_name,
)
from supervisor.coord.config import RdzvConfig, RdzvConfigError, parse_conf
from supervisor.core.topology import Topology
from supervisor.process.spawn import Program

EXIT_USAGE = 2
FINISHED_FLAG_ENV = "FAULT_TOL_FINISHED_FLAG_FILE"  # nvidia-resiliency-ext's auto-resume contract


def _conflicting_supervisord() -> str | None:
    """supervisord's distribution installs the same import name, ``supervisor``."""
    try:
        dist = importlib.metadata.distribution("supervisor")
    except importlib.metadata.PackageNotFoundError:
        return None
    return dist.version


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


def _run_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "run",
        help="launch the ranks of this node (torchrun-compatible) and supervise them",
        description="Launch and supervise the ranks of one node. Accepts torchrun's options.",
        # a prefix of one of our options after the script (train.py --kill 3) belongs to the
        # script: argparse would take it as ours, or fail as ambiguous
        allow_abbrev=False,
    )
    g = p.add_argument_group("torchrun options")
    _opt(
        g,
        "--nnodes",
        default="1:1",
        help="number of nodes, N or MIN:MAX (a node beyond MAX waits as a spare)",
    )
    _opt(g, "--nproc-per-node", default="1", help="ranks on this node: an integer, cpu, gpu or auto")
    _opt(g, "--node-rank", type=int, default=0, help="rank of this node (static backend; others assign it)")
    _opt(g, "--standalone", action="store_true", help="single-node run with a local store on a free port")
    _opt(g, "--rdzv-backend", default="static", help="rendezvous backend: c10d, static or etcd-v2")
    _opt(g, "--rdzv-endpoint", default="", help="rendezvous endpoint HOST:PORT")
    _opt(g, "--rdzv-id", default=None, help="run id (TORCHELASTIC_RUN_ID); default: a fresh uuid")
    _opt(g, "--run-id", default=None, help="alias of --rdzv-id")
    _opt(
        g,
        "--rdzv-conf",
        default="",
        help="rendezvous configuration key=value,...: join_timeout, last_call_timeout, close_timeout, "
        "keep_alive_interval, keep_alive_max_attempt, is_host, read_timeout",
    )
    _opt(g, "--max-restarts", type=int, default=0, help="restarts allowed to the whole job before failing")
    _opt(g, "--monitor-interval", type=float, default=0.1, help="accepted; exits are noticed at once")
    _opt(
        g,
        "--start-method",
        default="spawn",
        choices=["spawn", "fork", "forkserver"],
        help="accepted; ranks always start through the ft-supervisor bootstrap",
    )
    _opt(g, "--role", default="default", help="role name of the ranks (ROLE_NAME)")
    _opt(g, "-m", "--module", action="store_true", help="run SCRIPT as a module, like python -m")
    _opt(g, "--no-python", action="store_true", help="exec SCRIPT directly instead of with python")
    _opt(g, "--run-path", action="store_true", help="accepted; the script always runs as __main__")
    _opt(g, "--log-dir", default=None, help="base directory for logs (default ./ft-supervisor-logs)")
    _opt(g, "-r", "--redirects", default="0", help="streams shown only in the log files: 0-3 or 0:1,1:2")
    _opt(g, "-t", "--tee", default="0", help="streams written to the log files and the console")
    _opt(g, "--local-ranks-filter", default="", help="only show these local ranks on the console")
    _opt(g, "--master-addr", default=None, help="address of rank 0 (MASTER_ADDR)")
    _opt(
        g,
        "--master-port",
        type=int,
        default=None,
        help="port of rank 0's store; default: a fresh free port every generation",
    )
    _opt(g, "--local-addr", default=None, help="address of this node")
    _opt(
        g,
        "--signals-to-handle",
        default=DEFAULT_SIGNALS,
        action=hostingconfig.StoreGiven,
        help="signals that stop the run (SIGHUP reloads instead when there is a config file)",
    )
    _opt(
        g,
        "--shutdown-timeout",
        type=float,
        default=float(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")),
        help="seconds between SIGTERM and SIGKILL when stopping ranks",
    )
    _opt(
        g,
        "--virtual-local-rank",
        action="store_true",
        help="LOCAL_RANK=0 for every rank, each seeing only its own device",
    )
    for name in (
        "--event-log-handler",
        "--logs-specs",
        "--numa-binding",
        "--duplicate-stdout-filters",
        "--duplicate-stderr-filters",
    ):
        _opt(g, name, default=None, help=argparse.SUPPRESS)
    _supervisor_options(p.add_argument_group("ft-supervisor options"))
    ftconfig.add_options(p.add_argument_group("hang detection (nvidia-resiliency-ext --ft-* names)"))
    policyconfig.add_options(p.add_argument_group("failure policy: exit codes, rules, plugins"))
    metricsconfig.add_options(p.add_argument_group("metrics: an optional Prometheus endpoint"))
    hostingconfig.add_options(p.add_argument_group("service: systemd, container entrypoint"))
    checkpointconfig.add_options(p.add_argument_group("checkpoint sync: LOCAL to DEST, copy-back at start"))
    p.add_argument("training_script", help="the training program (or module with -m)")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    p.set_defaults(handler=_run, command_parser=p)
    return p


def _supervisor_options(f: Any) -> None:
    """Ours: how ranks are stopped, started and held, and where the run's files go."""
    _opt(
        f,
        "--kill-timeout",
        type=float,
        default=10.0,
        help="seconds to wait after SIGKILL before reporting a rank as stuck in the kernel",
    )
    _opt(
        f,
        "--exit-grace",
        type=float,
        default=10.0,
        help="seconds a rank that reported its failure (error file, client) may take to exit "
        "before it is killed",
    )
    _opt(
        f,
        "--save-timeout",
        type=float,
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
        "only, even where a cgroup per generation could be created (README: process containment)",
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
        "--no-fast-exit",
        action="store_true",
        help="let ranks run CPython's full garbage collection at exit (0.4-0.7 s with torch)",
    )
    _opt(f, "--log-level", default="info", choices=["debug", "info", "warning", "error"],
         action=hostingconfig.StoreGiven)  # fmt: skip
    _opt(
        f,
        "--state-dir",
        default=None,
        help="where learned timeouts persist (default <log-dir>/<run id>/state)",
    )
    _opt(f, "--workers-stop-timeout", type=float, default=None, help=argparse.SUPPRESS)  # ft_launcher's name
    _opt(f, "--term-timeout", type=float, default=None, help=argparse.SUPPRESS)  # ft_launcher's name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ft-supervisor",
        description="Keep distributed PyTorch training alive: launch, watch, restart.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _run_parser(sub)
    from supervisor import ctl  # noqa: PLC0415 - keeps `run` from importing zmq twice over

    ctl.add_commands(sub)
    from supervisor import postmortem  # noqa: PLC0415

    postmortem.add_commands(sub)
    from supervisor import runreport  # noqa: PLC0415

    runreport.add_commands(sub)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("ft-supervisor")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


_UNSUPPORTED = {
    "event_log_handler": ("--event-log-handler", "null"),
    "logs_specs": ("--logs-specs", None),
    "numa_binding": ("--numa-binding", None),
    "duplicate_stdout_filters": ("--duplicate-stdout-filters", None),
    "duplicate_stderr_filters": ("--duplicate-stderr-filters", None),
}


def _rendezvous(ns: argparse.Namespace) -> RdzvConfig | None:
    """The rendezvous of a multi-node run; None for a single node (no rendezvous needed)."""
    lo, hi = parse_nnodes(ns.nnodes)
    if ns.standalone and ns.rdzv_endpoint:
        raise ConfigError(
            f"--standalone starts its own local store; it contradicts --rdzv-endpoint {ns.rdzv_endpoint}"
        )
    if hi == 1:
        if ns.node_rank != 0:
            raise ConfigError(f"--node-rank {ns.node_rank}: with one node the only node rank is 0")
        return None
    if ns.standalone:
        raise ConfigError(f"--standalone is a single-node run; it contradicts --nnodes {ns.nnodes}")
    endpoint = ns.rdzv_endpoint.strip()
    if not endpoint and ns.rdzv_backend == "static" and ns.master_addr and ns.master_port:
        endpoint = f"{ns.master_addr}:{ns.master_port}"  # torchrun's static default
    try:
        return RdzvConfig(
            backend=ns.rdzv_backend,
            endpoint=endpoint,
            run_id=_given_run_id(ns) or "none",  # every node must name the same job
            min_nodes=lo,
            max_nodes=hi,
            node_rank=ns.node_rank,
            local_addr=ns.local_addr,
            conf=parse_conf(ns.rdzv_conf),
        )
    except RdzvConfigError as exc:
        raise ConfigError(str(exc)) from None


def _check_unsupported(ns: argparse.Namespace) -> None:
    for dest, (option, accepted) in _UNSUPPORTED.items():
        value = getattr(ns, dest)
        if value is not None and value != accepted:
            raise ConfigError(f"{option} is not supported by ft-supervisor")


def _program(ns: argparse.Namespace, environ: Mapping[str, str]) -> Program:
    if ns.no_python and ns.module:
        raise ConfigError("--no-python and -m/--module contradict each other: use one")
    kind = "exec" if ns.no_python else "module" if ns.module else "script"
    python = environ.get("PYTHON_EXEC", sys.executable)
    if ns.preload == "auto":
        preload = default_preload(python, sys.executable) if kind != "exec" else ()
    elif ns.preload.strip().lower() in ("", "none"):
        preload = ()
    else:
        preload = tuple(m.strip() for m in ns.preload.split(",") if m.strip())
    if kind == "script" and not Path(ns.training_script).exists():
        raise ConfigError(f"training script {ns.training_script!r} does not exist")
    return Program(
        kind,
        ns.training_script,
        tuple(ns.training_script_args),
        python,
        preload,
        fast_exit=not ns.no_fast_exit,
    )


def _given_run_id(ns: argparse.Namespace) -> str | None:
    if ns.rdzv_id is not None and ns.run_id is not None and ns.rdzv_id != ns.run_id:
        raise ConfigError(f"--rdzv-id {ns.rdzv_id!r} and --run-id {ns.run_id!r} contradict each other")
    given = ns.rdzv_id if ns.rdzv_id is not None else ns.run_id
    return None if given is None else str(given)


def _run_id(ns: argparse.Namespace, rdzv: RdzvConfig | None) -> str:
    if rdzv is not None:
        return rdzv.run_id
    given = _given_run_id(ns)
    if ns.standalone:
        return str(uuid.uuid4())  # torchrun ignores an explicit id here too
    if given is not None:
        return str(given)
    # torchrun: a single-node run without a static master port is standalone
    return str(uuid.uuid4()) if ns.master_port is None else "none"


def _positive(option: str, value: float, *, zero_ok: bool = True) -> float:
    if value < 0 or (value == 0 and not zero_ok):
        raise ConfigError(f"{option} {value}: must be {'>= 0' if zero_ok else '> 0'}")
    return value


# each options module names the option in its errors; all of them are usage errors
_OPTION_ERRORS = (
    ftconfig.FtConfigError,
    policyconfig.PolicyConfigError,
    metricsconfig.MetricsConfigError,
    hostingconfig.HostingConfigError,
    checkpointconfig.CheckpointConfigError,
)


def build_run_config(ns: argparse.Namespace, environ: Mapping[str, str]) -> RunConfig:
    rdzv = _rendezvous(ns)
    _check_unsupported(ns)
    nproc = parse_nproc(ns.nproc_per_node, environ)
    if ns.max_restarts < 0:
        raise ConfigError(f"--max-restarts {ns.max_restarts}: must be >= 0")
    if ns.master_port is not None and not 0 < ns.master_port < 65536:
        raise ConfigError(f"--master-port {ns.master_port}: expected 1-65535")
    if ns.standalone and ns.master_port is not None:
        raise ConfigError("--standalone picks its own free port; it contradicts --master-port")
    try:
        ft = ftconfig.from_namespace(ns, environ)
        policy = policyconfig.from_namespace(ns, environ, ft)
        metrics = metricsconfig.from_namespace(ns, environ)
        stops = hostingconfig.stop_signals(parse_signals(ns.signals_to_handle), ns, environ, DEFAULT_SIGNALS)
        hosting = hostingconfig.from_namespace(ns, environ, stops)
        checkpoint = checkpointconfig.from_namespace(ns, environ)
    except _OPTION_ERRORS as exc:
        raise ConfigError(str(exc)) from None
    log_dir = Path(ns.log_dir or "ft-supervisor-logs").absolute()
    run_id = _run_id(ns, rdzv)
    shutdown = ns.workers_stop_timeout if ns.workers_stop_timeout is not None else ns.shutdown_timeout
    return RunConfig(
        program=_program(ns, environ),
        topology=_first_place(nproc, ns.role, rdzv),
        max_restarts=ns.max_restarts,
        run_id=run_id,
        master_addr=ns.master_addr or ns.local_addr or "localhost",
        # several nodes: node 0 picks a fresh port every generation (the static
        # backend's --master-port is its rendezvous store's)
        master_port=ns.master_port if rdzv is None else None,
        log_dir=log_dir,
        state_dir=Path(ns.state_dir).absolute() if ns.state_dir else log_dir / safe_name(run_id) / "state",
        redirects=parse_std("--redirects", ns.redirects, nproc),
        tee=parse_std("--tee", ns.tee, nproc),
        local_ranks_filter=parse_ranks_filter(ns.local_ranks_filter, nproc),
        shutdown_timeout=_positive("--shutdown-timeout", shutdown),
        kill_timeout=_positive("--kill-timeout", ns.kill_timeout, zero_ok=False),
        exit_grace=_positive("--exit-grace", ns.exit_grace, zero_ok=False),
        save_timeout=_positive("--save-timeout", ns.save_timeout),
        finished_flag=_finished_flag(ns),
        autoresume=ns.autoresume,
        stop_signals=stops,
        standby=not ns.no_standby and ns.max_restarts > 0,
        cgroups=not ns.no_cgroups,
        virtual_local_rank=ns.virtual_local_rank,
        log_level=hosting.log_level(ns.log_level, ft),
        ft=ft,
        policy=policy,
        rdzv=rdzv,
        metrics=metrics,
        hosting=hosting,
        checkpoint=checkpoint,
    )


def _finished_flag(ns: argparse.Namespace) -> Path | None:
    if ns.autoresume and not ns.finished_flag_file:
        raise ConfigError(
            f"--autoresume needs the file to create: --finished-flag-file PATH or ${FINISHED_FLAG_ENV}"
        )
    return Path(ns.finished_flag_file).absolute() if ns.finished_flag_file else None


def _first_place(nproc: int, role: str, rdzv: RdzvConfig | None) -> Topology:
    """Where this node expects to be until the rendezvous says: its ranks spawn meanwhile."""
    if rdzv is None:
        return Topology(nproc_per_node=nproc, role=role)
    nnodes = rdzv.max_nodes if rdzv.backend == "static" else rdzv.min_nodes
    node_rank = rdzv.node_rank if rdzv.node_rank < nnodes else 0
    return Topology(nproc_per_node=nproc, nnodes=nnodes, node_rank=node_rank, role=role)


def _run(ns: argparse.Namespace) -> int:
    try:
        config = build_run_config(ns, os.environ)
    except ConfigError as exc:
        ns.command_parser.error(str(exc))  # prints usage and the message; exits 2
    from supervisor.runtime.daemon import run_daemon  # noqa: PLC0415 - keeps --help fast

    return run_daemon(config)


def main(argv: Sequence[str] | None = None) -> int:
    clash = _conflicting_supervisord()
    if clash is not None:
        print(
            f"ft-supervisor: the 'supervisor' package (supervisord {clash}) is installed in this "
            "environment. It uses the same import name, 'supervisor', as ft-supervisor, so the two "
            "cannot share one environment: install ft-supervisor in its own virtual environment.",
            file=sys.stderr,
        )
        return EXIT_USAGE
    ns = build_parser().parse_args(argv)
    code: int = ns.handler(ns)
    return code
