"""What a failure leads to: the exit codes, the restart budget's window, the policy
preset, the user's rules and plugins, and the files written for schedulers.

Command-line options, each with an environment variable of the same name
(``--reschedule-exit-code`` / ``FT_SUPERVISOR_RESCHEDULE_EXIT_CODE``); the
command line wins. Every problem raises ``ConfigError`` naming the option.
"""

from __future__ import annotations

import argparse
import importlib.metadata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from supervisor.config import durations
from supervisor.config import files as configfile
from supervisor.config.environment import env_name, pick
from supervisor.config.errors import ConfigError
from supervisor.config.ft import FtConfig
from supervisor.core.exitcodes import PRESETS, ExitCodes, OutcomeError, apply_presets
from supervisor.core.policy import Policy
from supervisor.core.rules import PLUGIN_ENTRY_POINTS, RuleError, compile_rules


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    exit_codes: ExitCodes = field(default_factory=ExitCodes)
    restart_window: float | None = None
    policy: Policy = field(default_factory=Policy)
    presets: tuple[str, ...] = ()
    rules: tuple[Mapping[str, Any], ...] = ()  # the user's, validated
    rule_files: tuple[str, ...] = ()
    disabled_plugins: tuple[str, ...] = ()
    error_log_prefix: str | None = None
    reason_file: Path | None = None  # None: reason.json in the run directory


def add_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--abort-exit-code", type=int, default=None, help="exit code of an abort (default 2)")
    g.add_argument(
        "--reschedule-exit-code",
        type=int,
        default=None,
        help="exit code that asks the scheduler to run the job elsewhere (default 200; OSMO: 3)",
    )
    g.add_argument(
        "--restart-window",
        default=None,
        metavar="DURATION",
        help="count only the restarts of the last DURATION (90, 30m, 1d) against --max-restarts "
        "(default: all)",
    )
    g.add_argument(
        "--policy-preset",
        default=None,
        help=f"MindCluster recover-strategy names, comma-separated: {', '.join(PRESETS)}",
    )
    g.add_argument(
        "--rules",
        action="append",
        default=None,
        help="a TOML or YAML file of classifier rules (a list named rule or rules), tried before "
        "the built-in ones; a rule with a built-in's id replaces it (repeatable)",
    )
    g.add_argument("--disable-plugins", default=None, help="classifier plugins not to load, comma-separated")
    g.add_argument(
        "--error-log-prefix",
        default=None,
        help="on reschedule, write PREFIX.rank_<rank> per failed rank (OSMO launch scripts look for them)",
    )
    g.add_argument(
        "--reason-file",
        default=None,
        help="also write the reason as whole JSON of at most 4096 bytes here "
        "(/dev/termination-log on Kubernetes); reason.json stays in the run dir",
    )


def _number(option: str, value: Any, kind: type[int] | type[float]) -> Any:
    if value is None:
        return None
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{option} {value!r}: expected {'an integer' if kind is int else 'seconds'}"
        ) from None


def load_rules_file(path: str) -> list[Mapping[str, Any]]:
    """The rules in a TOML (or, by its suffix, YAML) file, read within ``configfile``'s bounds."""
    p = Path(path)
    try:
        doc = configfile.read(p, "yaml" if p.suffix in (".yaml", ".yml") else "toml")
    except OSError as exc:
        raise ConfigError(f"--rules {path}: cannot read it: {exc.strerror or exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"--rules {path}: {exc}") from None
    rules = doc.get("rules", doc.get("rule")) if isinstance(doc, Mapping) else doc
    if not isinstance(rules, list) or not all(isinstance(r, Mapping) for r in rules):
        raise ConfigError(f"--rules {path}: expected a list of rule tables named 'rule' or 'rules'")
    return rules


def builtin_layer() -> tuple[Mapping[str, Any], ...]:
    """The built-in rules, to check the user's overrides against: asked of the
    ``rules`` plugin through its entry point, as any plugin is found."""
    for ep in importlib.metadata.entry_points(group=PLUGIN_ENTRY_POINTS, name="rules"):
        layer = getattr(ep.load(), "builtin_rules", None)
        if callable(layer):
            return tuple(layer())
    return ()


def user_rules(files: Sequence[str]) -> tuple[Mapping[str, Any], ...]:
    out: list[Mapping[str, Any]] = []
    for path in files:
        layer = load_rules_file(path)
        try:
            compile_rules(builtin_layer(), layer)
        except RuleError as exc:
            raise ConfigError(f"--rules {path}: {exc}") from None
        out += layer
    try:
        compile_rules(builtin_layer(), out)
    except RuleError as exc:
        raise ConfigError(f"--rules: {exc}") from None
    return tuple(out)


def from_namespace(ns: argparse.Namespace, environ: Mapping[str, str], ft: FtConfig) -> PolicyConfig:
    codes = ExitCodes()
    abort = _number("--abort-exit-code", pick(ns, environ, "--abort-exit-code"), int)
    if abort is None:  # ft_launcher's exit code for "do not restart", where given
        abort = ft.no_restart_exit_code
    reschedule = _number("--reschedule-exit-code", pick(ns, environ, "--reschedule-exit-code"), int)
    try:
        codes = replace(
            codes, **{k: v for k, v in (("abort", abort), ("reschedule", reschedule)) if v is not None}
        )
    except OutcomeError as exc:
        raise ConfigError(str(exc)) from None
    window = durations.optional("--restart-window", pick(ns, environ, "--restart-window"), positive=True)
    presets = tuple(p.strip() for p in (pick(ns, environ, "--policy-preset") or "").split(",") if p.strip())
    policy = Policy(max_no_progress=ft.max_no_progress_cycles, min_progress=ft.min_progress_iterations)
    try:
        policy = apply_presets(presets, policy)
    except OutcomeError as exc:
        raise ConfigError(f"--policy-preset: {exc}") from None
    files = tuple(ns.rules or ()) or tuple(filter(None, (environ.get(env_name("--rules")) or "").split(":")))
    disabled = pick(ns, environ, "--disable-plugins") or ""
    reason = pick(ns, environ, "--reason-file")
    return PolicyConfig(
        exit_codes=codes,
        restart_window=window,
        policy=policy,
        presets=presets,
        rules=user_rules(files),
        rule_files=files,
        disabled_plugins=tuple(p.strip() for p in disabled.split(",") if p.strip()),
        error_log_prefix=pick(ns, environ, "--error-log-prefix"),
        reason_file=Path(reason).absolute() if reason else None,
    )
