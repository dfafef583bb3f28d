"""``ft-supervisor classify`` and ``ft-supervisor plugins``: the classifier chain,
offline, for SREs writing rules and for post-mortems.

``classify PATH...`` takes:

* run directories (``<log-dir>/<run id>/<stamp>-<host>-<pid>``): what the daemon
  judged there, judged again (``supervisor.postmortem.replay``): the decision the
  run ended on, or that it succeeded and the last failure it recovered from. A
  run id's directory holds one run directory per daemon started with that id
  (each attempt of an auto-resumed job): each is judged, oldest first.
  ``--check`` compares with the run's reason.json and exits 1 if they disagree.
  Several run directories (every node's of one job, in any order) also get one
  verdict for the job: its root rank and node (``supervisor.postmortem.job``);
  with ``--check``, nodes whose job_blame differ exit 1 too;
* rank logs, torchelastic error files (``*.json``) and launcher logs (torchrun's,
  ft_launcher's: told apart by what they print, or named with ``--agent-log``),
  and ``--dmesg`` kernel logs: classified together as one failure, with the
  given restarts left.

Logs of any size are read in one pass (``supervisor.postmortem.logs``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import orjson

from supervisor.config.durations import duration
from supervisor.core.classify import Classification
from supervisor.core.errorfile import order_failures
from supervisor.core.evidence import Evidence
from supervisor.core.exitcodes import OutcomeError, apply_presets
from supervisor.core.patterns import Screen
from supervisor.core.policy import Budget, History, Policy, decide
from supervisor.core.rules import compile_rules, prefilter
from supervisor.core.types import ExitStatus, RankExit, RankFailure
from supervisor.hooks import PluginSettings
from supervisor.hooks.registry import Registry
from supervisor.process.evidence import read_error_file_now

if TYPE_CHECKING:
    from supervisor.postmortem import logs
    from supervisor.postmortem.replay import ReplayedRun, Settings

# supervisor.postmortem is imported where a command uses it: every `ft-supervisor run`
# builds this module's parser, and a daemon never replays a run (~80 ms of its start)

FILES_RESTARTS = 3  # restarts left for a failure read from files alone


def _failure(rank: int, log: logs.LogFile | None, error: Path | None) -> RankFailure:
    record, error_at = read_error_file_now(error) if error is not None else (None, None)
    exit = RankExit(rank, rank, 0, ExitStatus(), at=0.0, at_wall=error_at or 0.0)
    notable = () if log is None else log.notable
    tail = () if log is None else log.tail
    return RankFailure(exit=exit, error=record, error_at=error_at, notable=notable, log_tail=tail)


def gather(paths: list[Path], dmesg: list[Path], agent: list[Path], extra: Screen | None = None) -> Evidence:
    """One failure's evidence from files: rank logs, error files, launcher and kernel logs."""
    return _gather(paths, dmesg, agent, extra)[0]


def _gather(
    paths: list[Path], dmesg: list[Path], agent: list[Path], extra: Screen | None
) -> tuple[Evidence, dict[int, logs.LogFile]]:
    """The evidence, and the logs that hold several ranks' lines, by the rank that stands for them."""
    from supervisor.postmortem import logs  # noqa: PLC0415 - see the imports

    failures: list[RankFailure] = []
    mixed: dict[int, logs.LogFile] = {}
    agent_lines: list[str] = []
    for path in paths:
        if path.suffix == ".json":
            failures.append(_failure(len(failures), None, path))
            continue
        log = logs.read_log(path, extra)
        if log.launcher:
            agent_lines += log.lines
            continue
        rank = len(failures) if log.rank is None else log.rank
        if log.owners:  # named once classified; a rank number no log has meanwhile
            rank = -1 - len(mixed)
            mixed[rank] = log
        failures.append(_failure(rank, log, None))
    for path in agent:
        agent_lines += logs.read_log(path, extra).lines
    node = [ln for p in dmesg for ln in logs.scan(p, extra)[0]]
    evidence = Evidence(tuple(order_failures(failures)), dmesg=tuple(node), agent_log=tuple(agent_lines))
    return evidence, mixed


def _named(c: Classification, mixed: dict[int, logs.LogFile]) -> Classification:
    """A log of several ranks' lines (a console without --redirects) stands for one
    failure: the rank is the one whose line the rule matched."""
    log = None if c.rank is None else mixed.get(c.rank)
    if log is None:
        return c
    owner = next((r for line in c.lines if (r := log.owner(line)) is not None), None)
    return replace(c, rank=owner)


def _extra(rule_files: list[str]) -> Screen | None:
    """The user's rules may match lines without a keyword: search for them too."""
    if not rule_files:
        return None
    from supervisor.config.policy import load_rules_file  # noqa: PLC0415

    return prefilter(compile_rules([r for path in rule_files for r in load_rules_file(path)]))


def add_commands(sub: Any) -> None:
    c = sub.add_parser("classify", help="classify failures offline: run directories, logs, error files")
    c.add_argument("paths", nargs="*", type=Path, help="run directories, rank or launcher logs, error files")
    c.add_argument("--dmesg", action="append", type=Path, default=[], help="a kernel log (Xid lines...)")
    c.add_argument("--agent-log", action="append", type=Path, default=[],
                   help="a launcher's log (torchrun, ft_launcher)")  # fmt: skip
    c.add_argument("--rules", action="append", default=[],
                   help="extra rules (TOML or YAML), as for run (default for a run: the run's)")  # fmt: skip
    c.add_argument("--disable-plugins", default=None,
                   help="plugins not to load, comma-separated (default for a run: the run's)")  # fmt: skip
    c.add_argument("--max-restarts", type=int, default=None,
                   help=f"the restart budget (default: the run's; files: {FILES_RESTARTS} left)")  # fmt: skip
    g = c.add_argument_group("the run's policy, as for run (default for a run: what its run_started "
                             "recorded; for files or an older run's log: run's defaults)")  # fmt: skip
    g.add_argument("--restart-window", type=duration, default=None)
    g.add_argument("--policy-preset", default=None)
    g.add_argument("--ft-max-no-progress-cycles", type=int, default=None)
    g.add_argument("--ft-min-progress-iterations", type=int, default=None)
    c.add_argument("--check", action="store_true",
                   help="compare each run directory with its reason.json; 1 if they disagree")  # fmt: skip
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(handler=_classify, command_parser=c)
    p = sub.add_parser("plugins", help="list the classifier plugins and rules that would load")
    p.add_argument("--rules", action="append", default=[], help="extra rules (TOML or YAML), as for run")
    p.add_argument("--disable-plugins", default="", help="plugins not to load, comma-separated")
    p.add_argument("--list-rules", action="store_true", help="also list every rule")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_plugins, command_parser=p)


def _usage(ns: argparse.Namespace, message: str) -> NoReturn:
    """Bad input exits 2 with one line, worded as ``run`` words it for the same input."""
    ns.command_parser.error(message)
    raise AssertionError("unreachable: error() exits")


def _user_rules(ns: argparse.Namespace) -> tuple[Any, ...]:
    from supervisor.config.errors import ConfigError  # noqa: PLC0415
    from supervisor.config.policy import user_rules  # noqa: PLC0415

    try:
        return user_rules(ns.rules)
    except ConfigError as exc:
        _usage(ns, str(exc))


def _disabled(ns: argparse.Namespace) -> tuple[str, ...] | None:
    if ns.disable_plugins is None:
        return None
    return tuple(p.strip() for p in ns.disable_plugins.split(",") if p.strip())


def _registry(ns: argparse.Namespace) -> Registry:
    registry = Registry(disabled=_disabled(ns) or ())
    registry.configure(PluginSettings(rules=_user_rules(ns)))
    return registry


def _problems(registry: Registry) -> list[str]:
    return [f"plugin {p.plugin} ({p.stage}): {p.error}" for p in registry.problems]


def _settings(ns: argparse.Namespace) -> Settings:
    from supervisor.postmortem.replay import Settings  # noqa: PLC0415 - see the imports

    if ns.restart_window is not None and ns.restart_window <= 0:
        _usage(ns, f"--restart-window {ns.restart_window:g}: must be more than 0 seconds")
    if ns.max_restarts is not None and ns.max_restarts < 0:
        _usage(ns, f"--max-restarts {ns.max_restarts}: must be >= 0")
    given = (ns.ft_max_no_progress_cycles, ns.ft_min_progress_iterations, ns.policy_preset)
    policy = None
    if any(v is not None for v in given):  # any of them: the others at run's defaults
        default = Policy()
        policy = Policy(
            max_no_progress=default.max_no_progress if given[0] is None else given[0],
            min_progress=default.min_progress if given[1] is None else given[1],
        )
        try:
            policy = apply_presets((ns.policy_preset or "").split(","), policy)
        except OutcomeError as exc:
            _usage(ns, f"--policy-preset: {exc}")
    return Settings(_user_rules(ns), _disabled(ns), policy, ns.restart_window, ns.max_restarts)


def _classify(ns: argparse.Namespace) -> int:
    from supervisor.postmortem.render import render_run, run_json  # noqa: PLC0415 - see the imports
    from supervisor.postmortem.replay import judge_run  # noqa: PLC0415
    from supervisor.postmortem.runlog import run_dirs  # noqa: PLC0415

    if not (ns.paths or ns.dmesg or ns.agent_log):
        print("ft-supervisor classify: give at least one log, error file or run directory", file=sys.stderr)
        return 2
    missing = [str(p) for p in (*ns.paths, *ns.dmesg, *ns.agent_log) if not p.exists()]
    if missing:
        print(f"ft-supervisor classify: no such file or directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    settings = _settings(ns)
    dirs = [p for p in ns.paths if p.is_dir()]
    runs = [r for d in dirs for r in run_dirs(d)]
    empty = [str(d) for d in dirs if not run_dirs(d)]
    if empty:
        print(f"ft-supervisor classify: no events.jsonl in {', '.join(empty)}", file=sys.stderr)
        return 2
    files = [p for p in ns.paths if not p.is_dir()]
    out: list[dict[str, Any]] = []
    text: list[str] = []
    agree = True
    judged = []
    for run_dir in runs:
        replayed = judge_run(run_dir, settings)
        judged.append(replayed)
        differ = _check(replayed, run_dir) if ns.check else None
        agree = agree and not differ
        out.append(run_json(replayed, differ))
        text.append(render_run(replayed, differ))
    job = _job(judged) if len(judged) > 1 else None
    if job is not None:
        text.append(job[1])
        agree = agree and (job[0]["agree"] or not ns.check)
    found = _classify_files(ns, settings, files) if files or ns.dmesg or ns.agent_log else None
    if found is not None:
        text.append(found[1])
    if not ns.json:
        print("\n\n".join(text))
    elif found is None and len(out) == 1:
        print(orjson.dumps(out[0], option=orjson.OPT_INDENT_2).decode())
    elif found is not None and not out:
        print(orjson.dumps(found[0], option=orjson.OPT_INDENT_2).decode())
    else:  # several: each run directory, the job's verdict, and the files' failure
        document = {"runs": out, **({"job": job[0]} if job is not None else {}),
                    **({"files": found[0]} if found is not None else {})}  # fmt: skip
        print(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode())
    return 0 if agree else 1


def _job(judged: list[ReplayedRun]) -> tuple[dict[str, Any], str]:
    """Every node's run directory of one job: its one verdict (JSON, text)."""
    from supervisor.postmortem.job import job_verdict, node_runs, render  # noqa: PLC0415 - see the imports

    verdict = job_verdict(node_runs(judged))
    return verdict.to_json(), render(verdict)


def _check(replayed: ReplayedRun, run_dir: Path) -> list[str]:
    """Where the replayed and the run's reason.json disagree, or why they cannot be compared."""
    from supervisor.postmortem.agree import disagreements  # noqa: PLC0415 - see the imports

    reason = run_dir / "reason.json"
    if not reason.is_file():
        return ["no reason.json to compare with"]
    try:
        differ = disagreements(replayed, orjson.loads(reason.read_bytes()))
    except orjson.JSONDecodeError as exc:
        return [f"reason.json is not JSON: {exc}"]
    if differ is None:
        return ["cannot be compared with reason.json: " + ("; ".join(replayed.problems) or "unfinished run")]
    return differ


def classify_run(run_dir: Path, settings: Settings | None = None) -> tuple[dict[str, Any], list[str]]:
    """``classify --json --check RUN_DIR``, in this process: the run judged again (as
    JSON), and where that disagrees with its reason.json (empty: they agree)."""
    from supervisor.postmortem.render import run_json  # noqa: PLC0415 - see the imports
    from supervisor.postmortem.replay import judge_run  # noqa: PLC0415

    replayed = judge_run(run_dir, settings)
    differ = _check(replayed, run_dir)
    return run_json(replayed, differ), differ


def _classify_files(
    ns: argparse.Namespace, settings: Settings, files: list[Path]
) -> tuple[dict[str, Any], str]:
    from supervisor.postmortem.render import render_files  # noqa: PLC0415 - see the imports

    registry = _registry(ns)
    evidence, mixed = _gather(files, ns.dmesg, ns.agent_log, _extra(ns.rules))
    c = _named(registry.classify(evidence), mixed)
    left = FILES_RESTARTS if settings.max_restarts is None else settings.max_restarts
    policy = settings.policy or Policy()
    decision = decide(evidence, c, History(), Budget(left, settings.window), 0.0, policy=policy)
    out = {
        "classification": c.to_json(),
        "decision": {
            "action": str(decision.action),
            "reason": str(decision.reason),
            "detail": decision.detail,
        },
        "problems": _problems(registry),
    }
    return out, render_files(c, decision, _problems(registry))


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
