"""From the parsed command line (and the environment) to one RunConfig.

Every check that needs more than one option, or the environment, is here; each
failure is a ConfigError naming the option.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import shutil
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path

from supervisor.config import checkpoints, ft, health, hosting, memory, metrics, policy, stragglers, torchrun
from supervisor.config.errors import ConfigError
from supervisor.config.options import FINISHED_FLAG_ENV
from supervisor.config.rendezvous import RdzvConfig, parse_conf
from supervisor.config.run import (
    DEFAULT_SIGNALS,
    RunConfig,
    count_gpus,
    default_preload,
    parse_nnodes,
    parse_nproc,
    parse_ranks_filter,
    parse_signals,
    parse_std,
    safe_name,
)
from supervisor.core.program import Program
from supervisor.core.topology import Topology


def _rendezvous(ns: argparse.Namespace) -> RdzvConfig | None:
    """The rendezvous of a multi-node run; None for a single node (no rendezvous needed)."""
    lo, hi = parse_nnodes(ns.nnodes)
    conf = parse_conf(ns.rdzv_conf, ns.rdzv_backend)  # checked on a single node too: a typo is a typo
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
    return RdzvConfig(
        backend="etcd-v2" if ns.rdzv_backend == "etcd" else ns.rdzv_backend,
        endpoint=endpoint,
        run_id=_given_run_id(ns) or "none",  # every node must name the same job
        min_nodes=lo,
        max_nodes=hi,
        node_rank=ns.node_rank,
        local_addr=ns.local_addr,
        conf=conf,
    )


def _torchrun_ignored(ns: argparse.Namespace, environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The torchrun options given that have no effect here, each with why."""
    found = getattr(ns, "torchrun_options", None) or torchrun.Options(None, torchrun.TABLE, "the table")
    if ns.logs_specs is not None:
        _check_logs_specs(ns.logs_specs)
    gpus = count_gpus(environ) if ns.numa_binding is not None else 0
    return torchrun.ignored(
        vars(ns), found, numa=torchrun.numa_nodes(), gpus=gpus, several_nodes=parse_nnodes(ns.nnodes)[1] > 1
    )


def _numa_binding(ns: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """torchrun's --numa-binding mode where it means something: GPUs on several NUMA nodes
    (elsewhere it is reported as ignored)."""
    if ns.numa_binding is None or torchrun.numa_nodes() < 2 or count_gpus(environ) == 0:
        return None
    if shutil.which("numactl") is None:  # torch's binding checks for it and fails every rank
        raise ConfigError(f"--numa-binding {ns.numa_binding}: torch's NUMA binding needs numactl (not found)")
    return str(ns.numa_binding)


def _check_logs_specs(name: str) -> None:
    """torchrun loads a LogsSpecs class by its entry point name; a name that none has is its error."""
    group = importlib.metadata.entry_points(group="torchrun.logs_specs")
    if not group.select(name=name):
        known = ", ".join(sorted(ep.name for ep in group)) or "none installed"
        raise ConfigError(f"--logs-specs {name!r}: no torchrun.logs_specs entry point by that name ({known})")


def _program(ns: argparse.Namespace, environ: Mapping[str, str]) -> Program:
    if ns.no_python and ns.module and not ns.run_path:
        raise ConfigError("--no-python and -m/--module contradict each other: use one")
    # torchrun's --run-path runs the script in its own interpreter, over --no-python and -m
    kind = "script" if ns.run_path else "exec" if ns.no_python else "module" if ns.module else "script"
    python = sys.executable if ns.run_path else environ.get("PYTHON_EXEC", sys.executable)
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


def build_run_config(ns: argparse.Namespace, environ: Mapping[str, str]) -> RunConfig:
    rdzv = _rendezvous(ns)
    nproc = parse_nproc(ns.nproc_per_node, environ, environ.get("PYTHON_EXEC", sys.executable))
    torchrun_ignored = _torchrun_ignored(ns, environ)
    if ns.max_restarts < 0:
        raise ConfigError(f"--max-restarts {ns.max_restarts}: must be >= 0")
    if ns.master_port is not None and not 0 < ns.master_port < 65536:
        raise ConfigError(f"--master-port {ns.master_port}: expected 1-65535")
    if ns.standalone and ns.master_port is not None:
        raise ConfigError("--standalone picks its own free port; it contradicts --master-port")
    ft_config = ft.from_namespace(ns, environ)
    policy_config = policy.from_namespace(ns, environ, ft_config)
    metrics_config = metrics.from_namespace(ns, environ)
    stops = hosting.stop_signals(parse_signals(ns.signals_to_handle), ns, environ, DEFAULT_SIGNALS)
    hosting_config = hosting.from_namespace(ns, environ, stops)
    checkpoint = checkpoints.from_namespace(ns, environ)
    log_dir = Path(ns.log_dir or "ft-supervisor-logs").absolute()
    run_id = _run_id(ns, rdzv)
    program = _program(ns, environ)
    shutdown = ns.workers_stop_timeout if ns.workers_stop_timeout is not None else ns.shutdown_timeout
    return RunConfig(
        program=program,
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
        term_timeout=ns.term_timeout,
        kill_timeout=_positive("--kill-timeout", ns.kill_timeout, zero_ok=False),
        exit_grace=_positive("--exit-grace", ns.exit_grace, zero_ok=False),
        save_timeout=_positive("--save-timeout", ns.save_timeout),
        finished_flag=_finished_flag(ns),
        autoresume=ns.autoresume,
        mtbf=_mtbf(ns.mtbf),
        snapshot_memory=memory.parse(str(ns.snapshot_memory), memory.mem_total()),
        snapshot_replication_rate=memory.parse_rate(str(ns.snapshot_replication_rate)),
        stop_signals=stops,
        standby=not ns.no_standby and ns.max_restarts > 0,
        cgroups=not ns.no_cgroups,
        fork_server=not ns.no_fork_server,
        virtual_local_rank=ns.virtual_local_rank,
        log_level=ns.log_level,
        log_format=ns.log_format,
        ranks_torch=torchrun.torch_version(program.python) if program.kind != "exec" else None,
        ft=ft_config,
        policy=policy_config,
        rdzv=rdzv,
        metrics=metrics_config,
        hosting=hosting_config,
        checkpoint=checkpoint,
        health=health.from_namespace(ns, environ),
        stragglers=stragglers.from_namespace(ns, environ),
        numa_binding=_numa_binding(ns, environ),
        duplicate_stdout=tuple(ns.duplicate_stdout_filters),
        duplicate_stderr=tuple(ns.duplicate_stderr_filters),
        torchrun_ignored=torchrun_ignored,
    )


def _mtbf(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"--mtbf {value}: expected a positive number of seconds")
    return value


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


