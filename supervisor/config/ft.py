"""Hang-detection settings, with nvidia-resiliency-ext's names and precedence.

Every setting comes from, highest first:
    the command line   --ft-rank-heartbeat-timeout 30   (or --ft-rank_heartbeat_timeout)
    the environment    FT_RANK_HEARTBEAT_TIMEOUT=30
    a config file      --ft-cfg-path FILE (or FAULT_TOL_CFG_PATH): YAML or TOML, whose
                       ``fault_tolerance`` section may sit anywhere in a larger document
    the defaults
so an ft_launcher command line or config file works unchanged: every option of
ft_launcher, in every spelling it has had (``--ft-x-y``, ``--ft-x_y``, ``--ft_x_y``,
``--ft-param-x_y``, ``--ignore-missing-fault-tol-cfg``), is accepted. The ones with
a meaning here are honoured; the others are reported once, with why, in the
``settings_ignored`` event. ``log_level`` is NVRx's own logging: the daemon's
console follows ``--log-level`` alone. With a config file, SIGHUP re-reads the
timeouts (``runtime/lifecycle/reload.py``). Every setting in seconds takes the one
duration syntax (``supervisor.config.durations``): ``90``, ``30s``, ``5m``, ``step:5m``.

The settings and how each value is read are ``ft_settings``; the ``--ft-*`` options,
``ft_options``; both re-exported here. This module merges them into an ``FtConfig``.
"""

from __future__ import annotations

import signal
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from supervisor.config import files as configfile
from supervisor.config.errors import ConfigError
from supervisor.config.ft_options import ALIASES as ALIASES  # noqa: PLC0414 - re-exported
from supervisor.config.ft_options import add_options as add_options  # noqa: PLC0414
from supervisor.config.ft_options import cli_settings as cli_settings  # noqa: PLC0414
from supervisor.config.ft_options import spellings as spellings  # noqa: PLC0414
from supervisor.config.ft_settings import (
    IGNORED,
    KEYS,
    MIN_HEALTHY,
    RESTART_POLICIES,
    SETTINGS,
    UNKNOWN,
)
from supervisor.core.watch import Timeouts


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
    no_restart_exit_code: int | None = None  # None: --abort-exit-code's
    # settings given that have no effect here: (the setting as given, why), in order
    ignored: tuple[tuple[str, str], ...] = ()

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
    return {k: environ[f"FT_{k.upper()}"] for k in SETTINGS if f"FT_{k.upper()}" in environ}


def _restart_policy(where: str, value: object) -> str | None:
    """Why ``--ft-restart-policy`` is ignored, or None where it is what happens here."""
    policy = str(value).strip().lower()
    if policy not in RESTART_POLICIES:
        raise ConfigError(f"{where} {_shown(value)}: expected {' or '.join(RESTART_POLICIES)}")
    return MIN_HEALTHY if policy == "min-healthy" else None


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
    ignored: dict[str, tuple[str, str]] = {}  # per setting, the last layer's spelling
    for layer, name, lenient in layers:
        for raw_key, value in layer.items():
            key = _normalise(raw_key)
            if key in KEYS:
                values[key] = _check(name(key), key, value)
                ignored.pop(key, None)
            elif key == "restart_policy":
                why = _restart_policy(name(key), value)
                if why is None:
                    ignored.pop(key, None)
                else:
                    ignored[key] = (f"{name(key)} {value}", why)
            elif key in IGNORED:
                ignored[key] = (name(key), IGNORED[key])
            elif lenient:
                ignored[key] = (name(key), UNKNOWN)
            else:
                raise ConfigError(f"{name(key)}: unknown fault-tolerance setting")
    names = {f.name for f in fields(FtConfig)}
    return FtConfig(**{k: v for k, v in values.items() if k in names}, ignored=tuple(ignored.values()))


def from_namespace(ns: Any, environ: Mapping[str, str]) -> FtConfig:
    return load(cli_settings(ns), environ, Path(ns.ft_cfg_path) if ns.ft_cfg_path else None)
