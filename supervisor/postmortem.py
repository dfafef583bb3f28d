"""``ft-supervisor classify`` and ``ft-supervisor plugins``: the classifier chain,
offline, for SREs writing rules and for post-mortems.

``classify PATH...`` takes rank log files, torchelastic error files (``*.json``)
or a run directory (the latest generation's ranks, with their exits from
``events.jsonl``), and ``--dmesg`` / ``--agent-log`` files; it runs the same
plugins and policy the daemon runs, for a first occurrence with the given
restarts left, and prints the decision, the rule and the lines that matched.
Logs of any size are read in chunks: only the lines a rule could match (see
``supervisor.core.notable``) and a bounded tail are kept, so a 100 MB log costs
one pass and little memory.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
from collections import deque
from pathlib import Path
from typing import Any

import orjson

from supervisor.core.classify import Classification
from supervisor.core.errorfile import order_failures, parse_error_file
from supervisor.core.evidence import Evidence
from supervisor.core.notable import notable_lines
from supervisor.core.policy import Budget, History, decide
from supervisor.core.rules import compile_rules, prefilter
from supervisor.core.types import ErrorRecord, ExitStatus, RankExit, RankFailure
from supervisor.hooks import PluginSettings
from supervisor.hooks.registry import Registry

CHUNK = 4 << 20
KEEP_FIRST = 64
KEEP_LAST = 448
TAIL = 40
LINE_MAX = 4096


def scan(path: Path, extra: re.Pattern[str] | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the lines worth classifying: the first ones and the latest, bounded; the last lines).

    Worth classifying: a line with one of ``supervisor.core.notable``'s keywords (every
    built-in rule's lines have one), or one that ``extra`` (the user's rules) finds.
    """
    first: list[str] = []
    latest: deque[str] = deque(maxlen=KEEP_LAST)
    tail: deque[str] = deque(maxlen=TAIL)
    carry = ""
    with path.open("r", errors="replace") as f:
        while chunk := f.read(CHUNK):
            text = carry + chunk
            cut = text.rfind("\n") + 1
            text, carry = text[:cut], text[cut:]
            if len(carry) > LINE_MAX * 16:  # a runaway line: keep its start only
                text, carry = text + carry[:LINE_MAX] + "\n", ""
            _keep(text, extra, first, latest)
            tail.extend(text[-TAIL * LINE_MAX :].splitlines()[-TAIL:])
    if carry:
        _keep(carry + "\n", extra, first, latest)
        tail.append(carry)
    return (*first, *latest), tuple(tail)


def _keep(text: str, extra: re.Pattern[str] | None, first: list[str], latest: deque[str]) -> None:
    lines = notable_lines(text)
    if extra is not None:
        found = set(lines)
        lines += [ln for ln in text.splitlines() if ln not in found and extra.search(ln)]
    for line in lines:
        (first if len(first) < KEEP_FIRST else latest).append(line[:LINE_MAX])


def _exits(run_dir: Path) -> tuple[int | None, dict[int, dict[str, Any]]]:
    """The latest generation in the event log and its ranks' rank_exited events."""
    events = run_dir / "events.jsonl"
    if not events.is_file():
        return None, {}
    found: dict[int, dict[int, dict[str, Any]]] = {}
    for line in events.read_bytes().splitlines():
        try:
            e = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(e, dict) and e.get("event") == "rank_exited":
            local = e.get("local_rank", e.get("rank")) or 0
            found.setdefault(int(e.get("generation") or 0), {})[int(local)] = e
    if not found:
        return None, {}
    latest = max(found)
    return latest, found[latest]


def _status(event: dict[str, Any] | None) -> ExitStatus:
    if event is None:
        return ExitStatus()
    if event.get("signal"):
        name = str(event["signal"])
        return (
            ExitStatus(signal=int(signal.Signals[name]))
            if name in signal.Signals.__members__
            else ExitStatus()
        )
    code = event.get("exit_code")
    return ExitStatus(code=code if isinstance(code, int) else None)


def _failure(
    rank: int,
    pattern: re.Pattern[str] | None,
    log: Path | None,
    error: Path | None,
    status: ExitStatus,
    *,
    at_wall: float = 0.0,
) -> RankFailure:
    notable: tuple[str, ...] = ()
    tail: tuple[str, ...] = ()
    if log is not None and log.is_file():
        notable, tail = scan(log, pattern)
    record: ErrorRecord | None = None
    error_at = None
    if error is not None and error.is_file():
        record = parse_error_file(error.read_text(errors="replace")[: 1 << 20])
        error_at = error.stat().st_mtime if record is not None else None
    exit = RankExit(rank, rank, 0, status, at=0.0, at_wall=at_wall or error_at or 0.0)
    return RankFailure(exit=exit, error=record, error_at=error_at, notable=notable, log_tail=tail)


def _from_run_dir(run_dir: Path, pattern: re.Pattern[str] | None) -> list[RankFailure]:
    """The failed ranks of the run's latest generation. A rank the daemon stopped
    (state ``stopped``) counts only if it wrote an error file: it failed first."""
    generation, exits = _exits(run_dir)
    gens = sorted(
        run_dir.glob("gen_*"), key=lambda p: int(p.name.split("_")[1]) if p.name[4:].isdigit() else -1
    )
    if not gens:
        return []
    gen_dir = run_dir / f"gen_{generation}" if generation is not None else gens[-1]
    out = []
    for rank_dir in sorted(gen_dir.glob("local_rank_*")):
        local = int(rank_dir.name.rsplit("_", 1)[1])
        event = exits.get(local) or {}
        status = _status(event or None)
        error = rank_dir / "error.json"
        stopped = event.get("state") == "stopped" and not error.is_file()
        if (event and status.succeeded) or stopped:
            continue
        rank = int(event.get("rank", local))
        at = float(event.get("t_wall") or 0.0)
        out.append(_failure(rank, pattern, rank_dir / "stderr.log", error, status, at_wall=at))
    return out


def gather(
    paths: list[Path], dmesg: list[Path], agent: list[Path], extra: re.Pattern[str] | None = None
) -> Evidence:
    pattern = extra
    failures: list[RankFailure] = []
    for path in paths:
        if path.is_dir():
            failures += _from_run_dir(path, pattern)
        elif path.suffix == ".json":
            failures.append(_failure(len(failures), pattern, None, path, ExitStatus()))
        else:
            failures.append(_failure(len(failures), pattern, path, None, ExitStatus()))
    node = [ln for p in dmesg for ln in scan(p, pattern)[0]]
    agent_lines = []
    for p in agent:
        kept, tail = scan(p, pattern)
        agent_lines += [*kept, *(ln for ln in tail if ln not in kept)]
    return Evidence(tuple(order_failures(failures)), dmesg=tuple(node), agent_log=tuple(agent_lines))


def _extra(rule_files: list[str]) -> re.Pattern[str] | None:
    """The user's rules may match lines without a keyword: search for them too."""
    if not rule_files:
        return None
    from supervisor.policyconfig import load_rules_file  # noqa: PLC0415

    return prefilter(compile_rules([r for path in rule_files for r in load_rules_file(path)]))


def add_commands(sub: Any) -> None:
    c = sub.add_parser("classify", help="classify failures offline: logs, error files, run directories")
    c.add_argument("paths", nargs="*", type=Path, help="rank logs, error files (*.json) or run directories")
    c.add_argument("--dmesg", action="append", type=Path, default=[], help="a kernel log (Xid lines...)")
    c.add_argument("--agent-log", action="append", type=Path, default=[], help="a launcher's log (torchrun)")
    c.add_argument("--rules", action="append", default=[], help="extra rules (TOML or YAML), as for run")
    c.add_argument("--disable-plugins", default="", help="plugins not to load, comma-separated")
    c.add_argument("--max-restarts", type=int, default=3, help="restarts left, for the decision shown")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(handler=_classify)
    p = sub.add_parser("plugins", help="list the classifier plugins and rules that would load")
    p.add_argument("--rules", action="append", default=[], help="extra rules (TOML or YAML), as for run")
    p.add_argument("--disable-plugins", default="", help="plugins not to load, comma-separated")
    p.add_argument("--list-rules", action="store_true", help="also list every rule")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_plugins)


def _registry(ns: argparse.Namespace) -> Registry:
    from supervisor.policyconfig import PolicyConfigError, user_rules  # noqa: PLC0415

    try:
        rules = user_rules(ns.rules)
    except PolicyConfigError as exc:
        raise SystemExit(f"ft-supervisor {ns.command}: {exc}") from None
    registry = Registry(disabled=[p.strip() for p in ns.disable_plugins.split(",") if p.strip()])
    registry.configure(PluginSettings(rules=rules))
    return registry


def _problems(registry: Registry) -> list[str]:
    return [f"plugin {p.plugin} ({p.stage}): {p.error}" for p in registry.problems]


def _classify(ns: argparse.Namespace) -> int:
    if not (ns.paths or ns.dmesg or ns.agent_log):
        print("ft-supervisor classify: give at least one log, error file or run directory", file=sys.stderr)
        return 2
    missing = [str(p) for p in (*ns.paths, *ns.dmesg, *ns.agent_log) if not p.exists()]
    if missing:
        print(f"ft-supervisor classify: no such file or directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    registry = _registry(ns)
    evidence = gather(ns.paths, ns.dmesg, ns.agent_log, _extra(ns.rules))
    c = registry.classify(evidence)
    decision = decide(evidence, c, History(), Budget(max(0, ns.max_restarts)), 0.0)
    if ns.json:
        out = {
            "classification": c.to_json(),
            "decision": {
                "action": str(decision.action),
                "reason": str(decision.reason),
                "detail": decision.detail,
            },
            "problems": _problems(registry),
        }
        print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
    else:
        print(_render(c, decision.action, decision.detail, registry))
    return 0


def _render(c: Classification, action: object, detail: str, registry: Registry) -> str:
    inside = f", inside {' > '.join(c.wrapped_by)}" if c.wrapped_by else ""
    out = [
        f"decision: {action} ({detail})",
        f"rule:     {c.rule} [{c.category}, {c.nature}] by {c.source or '-'}{inside}",
        f"          {c.summary}" if c.summary else "",
        f"rank:     {c.rank}" + (" (blames a peer)" if c.peer else ""),
        "matched:",
        *(f"  {line}" for line in c.lines),
        *_problems(registry),
    ]
    return "\n".join(line for line in out if line)


def _plugins(ns: argparse.Namespace) -> int:
    registry = _registry(ns)
    rules = getattr(registry.pm.get_plugin("rules"), "rules", ())
    if ns.json:
        out = {
            "loaded": [{"name": p.name, "value": p.value, "hooks": list(p.hooks)} for p in registry.loaded],
            "disabled": registry.disabled,
            "problems": _problems(registry),
            "rules": [{"id": r.id, "category": r.category, "action": str(r.action)} for r in rules],
        }
        print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
        return 0
    for p in registry.loaded:
        print(f"{p.name:<16} {p.value:<40} hooks: {', '.join(p.hooks)}")
    for name in registry.disabled:
        print(f"{name:<16} disabled")
    for problem in _problems(registry):
        print(problem)
    print(
        f"{len(rules)} rules in the built-in classifier" if rules else "the built-in classifier is not loaded"
    )
    if ns.list_rules:
        for r in rules:
            repeat = f", then {r.repeat}" if r.repeat else ""
            print(f"  {r.id:<20} {r.category:<18} {r.action}{repeat:<16} {r.summary}")
    return 0
