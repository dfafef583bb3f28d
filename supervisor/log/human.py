"""What an event says to a person reading the console.

The event log file is the machine record (one JSON object per event); the console is
read by people, so each common event is a short sentence after its name::

    [ft-supervisor] 10:43:22.290 WARNING decision: restart. rank 1: RuntimeError: ... [P9]

An event without a sentence here is shown as its fields, ``key=value`` with plain
values (never inline JSON). No line is longer than ``WIDTH``: the full record is in
the event log, and ``ft-supervisor events`` follows it live.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping
from typing import Any

WIDTH = 200  # a console line, prefix included, at most
Fields = Mapping[str, Any]


def plain(value: object) -> str:
    """A value as a person reads it: lists joined by commas, mappings as ``key value``
    pairs, numbers rounded, nothing quoted unless it holds spaces."""
    if isinstance(value, Mapping):
        inner = ", ".join(f"{k} {plain(v)}" for k, v in value.items() if v not in (None, {}, []))
        return f"({inner})" if inner else "-"
    if isinstance(value, list | tuple | set | frozenset):
        return ",".join(plain(v) for v in value) or "-"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value == value else "nan"  # noqa: PLR0124
    if value is None:
        return "-"
    text = str(value).replace("\n", "\\n")
    if not text or any(c.isspace() or c in '"=' for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def fields_line(fields: Fields) -> str:
    return " ".join(f"{k}={plain(v)}" for k, v in fields.items() if v is not None)


def wrap(line: str, width: int = WIDTH) -> list[str]:
    """A long line goes on in indented lines: all of it is shown, none wider than ``width``."""
    if len(line) <= width:
        return [line]
    return textwrap.wrap(line, width, subsequent_indent=INDENT, break_on_hyphens=False,
                         drop_whitespace=True) or [line[:width]]  # fmt: skip


INDENT = "    "


def _s(n: object, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _seconds(value: object) -> str:
    return f"{plain(value)} s" if isinstance(value, int | float) else "-"


def _gen(f: Fields) -> str:
    return f"generation {f['generation']}" if f.get("generation") is not None else "the run"


def _run_started(f: Fields) -> list[str]:
    lines = [f"{_s(f.get('nproc_per_node'), 'rank')} of {f.get('program')}, "
             f"at most {_s(f.get('max_restarts'), 'restart')}; pid {f.get('pid')}"]  # fmt: skip
    lines.append(f"run dir {f.get('run_dir')}")
    if f.get("standby"):
        preload = f.get("preload")
        lines.append("warm standby ranks" + (f", preloading {plain(preload)}" if preload else ""))
    else:
        lines.append("no standby ranks: each generation starts cold")
    lines.append("timeouts: " + timeouts_text(f.get("timeouts") or {}))
    policy = f.get("policy") or {}
    if policy:
        cycles = plain(policy.get("max_no_progress"))
        lines.append(f"on failure: {policy.get('on_failure', 'restart')}; "
                     f"abort after {cycles} failed generations in a row without progress")  # fmt: skip
    return lines


def timeouts_text(t: Fields) -> str:
    """The timeouts in force, as a person reads them (``status`` shows the same)."""
    parts = []
    for key, label in (("initial_heartbeat", "first heartbeat"), ("heartbeat", "heartbeat"),
                       ("out_of_section", "out of section")):  # fmt: skip
        if t.get(key) is not None:
            parts.append(f"{label} {_seconds(t[key])}")
    for name, value in (t.get("sections") or {}).items():
        parts.append(f"section {name} " + ("learning" if value is None else _seconds(value)))
    learned = t.get("learned") or {}
    known = {k: v for k, v in learned.items() if v not in (None, {}, [])}
    text = ", ".join(parts) or "none set: a rank that stops is found by its exit only"
    return text + (f"; learned {plain(known)}" if known else "")


def _rank_exited(f: Fields) -> str:
    how = (f"exit code {f['exit_code']}" if f.get("exit_code") is not None
           else f"signal {f.get('signal')}")  # fmt: skip
    standby = " (a standby, unused)" if f.get("standby") else ""
    return f"rank {f.get('rank')} (pid {f.get('pid')}) {f.get('state')}, {how}{standby}"


def _generation_ended(f: Fields) -> str:
    text = f"{_gen(f)} {f.get('result')}"
    if f.get("iteration") is not None:
        text += f" at iteration {f['iteration']}"
    stopped = [_s(f[k], f"rank {k}") for k in ("signalled", "killed", "swept") if f.get(k)]
    text += f"; {', '.join(stopped)}" if stopped else ""
    return text + f" (stopping took {_seconds(f.get('seconds'))})"


def _generation_started(f: Fields) -> str:
    where = f"{f.get('master_addr')}:{f.get('master_port')}"
    node = f", node {f['node_rank']} of {f.get('nnodes')}" if f.get("nnodes") not in (None, 1) else ""
    warm = f", {_s(f['standby_ranks'], 'warm standby rank')}" if f.get("standby_ranks") else ""
    return f"{_gen(f)} on {where}{node}{warm}"


def _decision(f: Fields) -> str:
    detail = f.get("detail") or f.get("reason")
    return f"{f.get('action')}. {detail}"


def _status(f: Fields) -> str:
    ranks = f.get("ranks") or []
    states: dict[str, int] = {}
    for r in ranks:
        states[str(r.get("state"))] = states.get(str(r.get("state")), 0) + 1
    iters = [r["iteration"] for r in ranks if isinstance(r.get("iteration"), int)]
    step = f", iterations {min(iters)}-{max(iters)}" if iters else ""
    return (f"{_gen(f)}, restarts {f.get('restarts_used')}/{f.get('max_restarts')}, "
            f"up {_seconds(f.get('uptime_s'))}; ranks {plain(states)}{step} "
            "(ft-supervisor status for all)")  # fmt: skip


def _run_finished(f: Fields) -> str:
    rss = f.get("daemon_max_rss_kb")
    memory = f"{round(rss / 1024)} MiB" if isinstance(rss, int) else "-"
    return (f"exit code {f.get('exit_code')} after {_seconds(f.get('seconds'))}, "
            f"{_s(f.get('restarts_used'), 'restart')}; the daemon used {_seconds(f.get('daemon_cpu_s'))} "
            f"of CPU and {memory}")  # fmt: skip


def _plugins_loaded(f: Fields) -> str:
    text = "classifiers " + plain(f.get("plugins"))
    text += f"; disabled {plain(f['disabled'])}" if f.get("disabled") else ""
    return text + (f"; FAILED {plain(f['failed'])}" if f.get("failed") else "")


def _hosting(f: Fields) -> str:
    roles = [("pid1", "pid 1 of a container"), ("subreaper", "child subreaper"), ("notify", "systemd notify")]
    said = [word for key, word in roles if f.get(key)]
    said += [f"forwarding {plain(f['forward_signals'])}"] if f.get("forward_signals") else []
    return ", ".join(said) or "a plain process"


def _containment(f: Fields) -> str:
    if f.get("mode") == "cgroup":
        return f"cgroup {f.get('cgroup')} (ended with {f.get('kill')})"
    return f"process groups, PDEATHSIG and a token sweep ({f.get('why')})"


def _fork_server(f: Fields) -> str:
    if f.get("mode") != "on":
        return f"off ({f.get('why')})"
    took = _seconds(f.get("seconds"))
    return f"{plain(f.get('modules'))} imported in {took} (pid {f.get('pid')}); ranks fork from it"


def _standby_ready(f: Fields) -> str:
    text = f"{_gen(f)}: {_s(f.get('ranks'), 'rank')} ready in {_seconds(f.get('seconds'))}"
    text += f" ({f['priority']} priority)" if f.get("priority") else ""
    if f.get("start") == "with_generation":
        text += f", started with the generation ({f.get('idle_cores')} idle cores)"
    return text


def _open_too_long(f: Fields) -> str:
    """A hang's deadline: which rank, what was open, for how long."""
    what = f"{f.get('kind')} {f['section']}" if f.get("section") else f"{f.get('kind')}"
    open_for, timeout = _seconds(f.get("open_for")), _seconds(f.get("timeout"))
    return f"rank {f.get('rank')}: {what} open {open_for} (timeout {timeout})"


def _rank_hung(f: Fields) -> str:
    late = f" noticed {_seconds(f['late_by'])} late" if f.get("late_by") else ""  # after its deadline
    return _open_too_long(f) + late + (f"; blamed by {f['blamed_by']}" if f.get("blamed_by") else "")


def _hang_bundle(f: Fields) -> str:
    took = _seconds(f.get("seconds"))
    text = f"{_gen(f)}: stacks of {_s(f.get('ranks'), 'rank')} in {f.get('path')} ({took})"
    behind = f.get("flight_recorder_behind")
    return text + (f"; behind in the flight recorder: ranks {plain(behind)}" if behind else "")


def _mb(value: object) -> str:
    return f"{value / 2**20:.1f} MiB" if isinstance(value, int | float) else "-"


SENTENCES: dict[str, Callable[[Fields], str | list[str]]] = {
    "snapshot_taken": lambda f: f"rank {f.get('rank')}: step {f.get('step')} held in memory "
    f"({_mb(f.get('bytes'))})",
    "snapshot_refused": lambda f: f"rank {f.get('rank')}: {_mb(f.get('bytes'))} not held ({f.get('why')}; "
    f"--snapshot-memory {_mb(f.get('budget'))}); training goes on",
    "resume_chosen": lambda f: f"rank {f.get('rank')}: "
    + (f"resumed at step {f.get('step')} from {f.get('source')}" if f.get("source") != "none"
       else "started from the beginning") + f" ({f.get('why')})",
    "snapshot_restored": lambda f: f"rank {f.get('rank')}: step {f.get('step')} from {f.get('source')} "
    f"({_mb(f.get('bytes'))})",
    "snapshots_released": lambda f: f"{_s(f.get('files'), 'file')}, {_mb(f.get('bytes'))}",
    "snapshots_agreed": lambda f: f"generation {f.get('generation')}: "
    + (f"the job restores step {f.get('step')}" if f.get("step") is not None else "no memory restore")
    + f" ({f.get('why')})",
    "snapshot_replicated": lambda f: f"rank {f.get('rank')}: step {f.get('step')} kept by node "
    f"{f.get('peer')} ({_mb(f.get('bytes'))}, {f.get('seconds')} s after it was taken)",
    "snapshot_replication_failed": lambda f: f"rank {f.get('rank')}: step {f.get('step')} not kept by node "
    f"{f.get('peer')} ({f.get('why')}); no more copies to it this generation",
    "snapshot_replica_rejected": lambda f: f"a replica from node {f.get('node')} (rank {f.get('rank')}, step "
    f"{f.get('step')}) not kept: {f.get('why')}",
    "snapshot_stride_changed": lambda f: f"replicating every {f.get('stride')} steps ({f.get('why')})",
    "snapshot_retained_dropped": lambda f: f"rank {f.get('rank')}: retained step {f.get('step')} dropped "
    f"({_mb(f.get('bytes'))}: {f.get('why')})",
    "snapshot_replicas_released": lambda f: f"replicas of rank(s) {plain(f.get('ranks'))} released "
    f"({_mb(f.get('bytes'))}: {f.get('why')})",
    "run_started": _run_started,
    "plugins_loaded": _plugins_loaded,
    "hosting": _hosting,
    "containment": _containment,
    "fork_server": _fork_server,
    "generation_started": _generation_started,
    "standby_ready": _standby_ready,
    "rank_failure_reported": lambda f: f"rank {f.get('rank')} says it failed ({f.get('how')}); "
    f"it has {_seconds(f.get('exit_grace'))} to exit",
    "rank_exited": _rank_exited,
    "generation_ended": _generation_ended,
    "decision": _decision,
    "job_decision": lambda f: f"{_gen(f)}: the job will {f.get('action')}",
    "reason_written": lambda f: f"{f.get('outcome')}, in {f.get('path')}",
    "run_finished": _run_finished,
    "status": _status,
    "deadline_missed": _open_too_long,
    "rank_hung": _rank_hung,
    "stacks_dumped": lambda f: f"rank {f.get('rank')}: {f.get('where') or 'stacks'} (in {f.get('log')})",
    "hang_bundle": _hang_bundle,
    "timeouts_calculated": lambda f: f"rank {f.get('rank')}: " + timeouts_text(f.get("in_force") or {}),
    "timeouts_learned": lambda f: f"{_gen(f)}: " + timeouts_text(f.get("in_force") or {}),
    "rendezvous_joined": lambda f: f"{_gen(f)}: node {f.get('node_rank')} of {f.get('nnodes')}, "
    f"master {f.get('master_addr')}:{f.get('master_port')}",
    "stop_requested": lambda f: f"{f.get('signal')}: stopping the ranks",
    "stop_forced": lambda f: f"{f.get('signal')} again: killing the ranks",
    "signal_forwarded": lambda f: f"{f.get('signal')} to {_s(f.get('ranks'), 'rank')}",
    "metrics_serving": lambda f: f"{f.get('url')}",
}


def sentence(name: str, fields: Fields) -> list[str]:
    """The event's text after its name: one line, or a first line and indented ones."""
    render = SENTENCES.get(name)
    if render is not None:
        try:
            said = render(fields)
        except (KeyError, TypeError, ValueError, AttributeError):
            said = fields_line(fields)  # an older or odd record: its fields, never a crash
    else:
        said = fields_line(fields)
    return said if isinstance(said, list) else [said]
