"""torchrun's options, as the ranks' torch declares them, without importing torch here.

``torch.distributed.run.get_args_parser()`` is the truth, but ``import torch`` costs
the daemon about 200 MiB and 1-2 s on every start (and on ``run --help``). So the
options of the pinned torch are a table checked into the package
(``torchrun_table``, written by ``scripts/gen_torchrun_table.py`` from torch's parser);
any other torch version is asked once, in a subprocess of the ranks' interpreter,
and its answer cached per version under ``$XDG_CACHE_HOME/ft-supervisor``. When
that fails the table is used, and said so.

``KNOWN`` classifies every option of torch's parser as honoured or ignored;
``tests/unit/test_torchrun_options.py`` fails the day torch adds one it does not
name. An option that a newer torch has and this table does not is accepted and
reported as ignored, never refused.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from supervisor.config import torchrun_table

_log = logging.getLogger(__name__)

INTROSPECT_TIMEOUT = 60.0  # importing torch.distributed.run on a loaded node
CACHE_MAX_BYTES = 1 << 20

# Run by the ranks' interpreter (which may not have ft-supervisor installed): prints
# torch's version and one record per option of its torchrun parser, as JSON.
INTROSPECT = """
import json, sys
from importlib.metadata import version
from torch.distributed.run import get_args_parser
out = []
for a in get_args_parser()._actions:
    if not a.option_strings or a.dest == "help":
        continue
    d = a.default
    out.append({
        "dest": a.dest,
        "flags": list(a.option_strings),
        "flag": a.nargs == 0,
        "default": d if d is None or isinstance(d, (str, int, float, bool, list)) else repr(d),
        "choices": None if a.choices is None else [str(c) for c in a.choices],
        "type": getattr(a.type, "__name__", "str") if a.type is not None else "str",
        "env": type(a).__name__ in ("env", "check_env"),
    })
json.dump({"torch": version("torch"), "options": out}, sys.stdout)
"""


@dataclass(frozen=True, slots=True)
class TorchrunOption:
    dest: str
    flags: tuple[str, ...]  # every spelling: --nproc-per-node and --nproc_per_node
    flag: bool  # takes no value (torch's check_env, a store_true)
    default: Any  # torch's default, as JSON
    choices: tuple[str, ...] | None
    type: str  # the name of torch's converter: str, int, float, comma_separated_list
    env: bool  # PET_<DEST> sets its default (torch's env and check_env actions)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TorchrunOption:
        choices = raw.get("choices")
        return cls(
            dest=str(raw["dest"]),
            flags=tuple(str(f) for f in raw["flags"]),
            flag=bool(raw["flag"]),
            default=raw.get("default"),
            choices=None if choices is None else tuple(str(c) for c in choices),
            type=str(raw.get("type") or "str"),
            env=bool(raw.get("env", False)),
        )

    @property
    def name(self) -> str:
        """The spelling a user reads: the first long one."""
        return next((f for f in self.flags if f.startswith("--")), self.flags[0])


@dataclass(frozen=True, slots=True)
class Options:
    torch: str | None  # the ranks' torch version; None where torch is not installed
    options: tuple[TorchrunOption, ...]
    source: str  # where they came from, for a reader: the table, or torch X's parser


TABLE = tuple(TorchrunOption(*row) for row in torchrun_table.OPTIONS)

# Every option of torch's torchrun: what ft-supervisor does with it. "honoured" ones
# act as under torchrun; "ignored" ones are accepted and, when given a value other
# than torch's default, reported once in the settings_ignored event with why
# (``ignored`` below; some are honoured or not depending on the value or the node).
KNOWN: dict[str, str] = {
    "nnodes": "honoured",
    "nproc_per_node": "honoured",
    "rdzv_backend": "honoured",  # etcd: served by etcd-v2, reported
    "rdzv_endpoint": "honoured",
    "rdzv_id": "honoured",
    "rdzv_conf": "honoured",
    "standalone": "honoured",
    "max_restarts": "honoured",
    "monitor_interval": "ignored",
    "start_method": "ignored",
    "event_log_handler": "ignored",
    "role": "honoured",
    "module": "honoured",
    "no_python": "honoured",
    "run_path": "honoured",
    "log_dir": "honoured",
    "redirects": "honoured",
    "tee": "honoured",
    "local_ranks_filter": "honoured",
    "duplicate_stdout_filters": "honoured",
    "duplicate_stderr_filters": "honoured",
    "node_rank": "honoured",
    "master_addr": "honoured",
    "master_port": "honoured",
    "local_addr": "honoured",
    "logs_specs": "ignored",
    "numa_binding": "honoured",  # where the node has GPUs on several NUMA nodes; else reported
    "signals_to_handle": "honoured",
    "shutdown_timeout": "honoured",
    "virtual_local_rank": "honoured",
}

WHY: dict[str, str] = {
    "monitor_interval": "a rank's exit is noticed by the event loop the moment its process ends, "
    "not polled every interval",
    "start_method": "ranks are forked from ft-supervisor's fork server, which imported the preload "
    "once (--no-fork-server: a fresh interpreter each), pre-started as standbys, not through "
    "torch's multiprocessing",
    "event_log_handler": "torchelastic's agent events are not produced; ft-supervisor records its own "
    "in <log-dir>/<run id>/<run>/events.jsonl",
    "logs_specs": "ft-supervisor writes each rank's output to its own files "
    "(<log-dir>/<run id>/<run>/gen_<g>/local_rank_<r>/stdout.log and stderr.log) and honours "
    "--redirects, --tee and --local-ranks-filter itself; no LogsSpecs class is loaded",
    "rdzv_backend=etcd": "run with torch's etcd-v2 rendezvous backend on the same etcd server: "
    "torch's older etcd backend has no dynamic state for ft-supervisor's coordinator to read",
    "numa_binding:one-node": "this node has one NUMA node: binding a rank to it changes nothing",
    "numa_binding:no-gpu": "no CUDA device is visible: torch binds each rank to the NUMA node of "
    "its GPU",
}


def _comma_separated_list(value: str) -> list[str]:
    """torch's: a,b -> [a, b]; a double comma is a literal comma."""
    placeholder = "\0"
    return [item.replace(placeholder, ",") for item in value.replace(",,", placeholder).split(",")]


CONVERTERS: dict[str, Callable[[str], Any]] = {
    "str": str,
    "int": int,
    "float": float,
    "comma_separated_list": _comma_separated_list,
}


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def torch_version(python: str) -> str | None:
    """The torch version of the ranks' interpreter, from package metadata (no import:
    200 MB in the daemon); None without torch. What the daemon sets for the ranks
    follows it too: torch renames variables and warns in every rank about the old names."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        try:
            return importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            return None
    code = "import importlib.metadata as m\ntry: print(m.version('torch'))\nexcept Exception: pass"
    try:
        out = subprocess.run(
            [python, "-I", "-c", code],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=INTROSPECT_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def cache_dir(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "ft-supervisor"


def introspect(python: str, environ: Mapping[str, str]) -> tuple[str, tuple[TorchrunOption, ...]]:
    """Ask the ranks' interpreter for its torch's torchrun options. Raises on any failure."""
    # torch's env action reads PET_* into its defaults: we want torch's own defaults
    env = {k: v for k, v in environ.items() if not k.startswith("PET_")}
    out = subprocess.run(
        [python, "-c", INTROSPECT],
        capture_output=True,
        text=True,
        timeout=INTROSPECT_TIMEOUT,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"exit code {out.returncode}: {last}")
    raw = json.loads(out.stdout)
    return str(raw["torch"]), tuple(TorchrunOption.from_json(o) for o in raw["options"])


def _cached(path: Path) -> tuple[TorchrunOption, ...] | None:
    try:
        if path.stat().st_size > CACHE_MAX_BYTES:
            return None
        raw = json.loads(path.read_bytes())
        return tuple(TorchrunOption.from_json(o) for o in raw["options"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or damaged: ask torch again


def _store(path: Path, version: str, options: Sequence[TorchrunOption]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"torch": version, "options": [asdict(o) for o in options]}))
        tmp.replace(path)
    except OSError as exc:  # a read-only home: ask again next time
        _log.debug("torchrun options not cached at %s: %s", path, exc)


def installed(python: str, environ: Mapping[str, str]) -> Options:
    """torchrun's options for the ranks' torch: the table when it is the pinned
    version (or torch is absent), else that torch's parser, cached per version."""
    version = torch_version(python)
    if version is None or _public(version) == torchrun_table.TORCH_VERSION:
        return Options(version, TABLE, f"the table of torch {torchrun_table.TORCH_VERSION}")
    return asked(python, environ, version)


def asked(python: str, environ: Mapping[str, str], version: str) -> Options:
    """torch ``version``'s options: from the cache, else from its parser (then cached),
    else, when that fails, the table."""
    path = cache_dir(environ) / f"torchrun-options-{version}.json"
    cached = _cached(path)
    if cached is not None:
        return Options(version, cached, f"torch {version}'s parser (cached in {path})")
    try:
        asked, options = introspect(python, environ)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, subprocess.TimeoutExpired) as exc:
        _log.warning(
            "torchrun options: asking torch %s for its parser failed (%s); using the table of torch %s",
            version,
            exc,
            torchrun_table.TORCH_VERSION,
        )
        return Options(version, TABLE, f"the table of torch {torchrun_table.TORCH_VERSION}")
    _store(cache_dir(environ) / f"torchrun-options-{asked}.json", asked, options)
    return Options(asked, options, f"torch {asked}'s parser")


def pet_default(action: argparse.Action) -> None:
    """torchrun's PET_<DEST> variable, where set, is the option's default."""
    pet = os.environ.get(f"PET_{action.dest.upper()}")
    if pet is None:
        return
    if action.nargs == 0:  # a flag: torchrun's check_env takes an integer; we also take true/yes
        action.default = pet.strip().lower() in ("1", "true", "yes", "on")
    else:
        action.default = pet


def add_options(group: Any, options: Sequence[TorchrunOption], ours: Mapping[str, Mapping[str, Any]]) -> None:
    """Declare ``options`` as torch does (spellings, value or flag, choices, type,
    PET_* defaults), with ``ours`` (help, and where our meaning differs, default,
    type or action) laid over them, option by option. Options of the pinned torch that
    an older torch's parser lacks are declared too, unlisted: the run reads them, and
    ft-supervisor applies them whatever the ranks' torch."""
    declared = {opt.dest for opt in options}
    older = [opt for opt in TABLE if opt.dest not in declared]
    for opt in (*options, *older):
        kw: dict[str, Any]
        if opt.flag:
            kw = {"action": "store_true"}
        else:
            kw = {"default": opt.default, "type": CONVERTERS.get(opt.type, str)}
            if opt.choices is not None:
                kw["choices"] = list(opt.choices)
        if opt.dest not in KNOWN:  # a newer torch's
            kw["help"] = "an option of the ranks' torch unknown to ft-supervisor: accepted, not applied"
        kw.update(ours.get(opt.dest, {}))
        if opt.dest not in declared:
            kw["help"] = argparse.SUPPRESS
        action = group.add_argument(*opt.flags, dest=opt.dest, **kw)
        if opt.env:
            pet_default(action)


def numa_nodes() -> int:
    """NUMA nodes of this machine (1 where the kernel shows none)."""
    nodes = Path("/sys/devices/system/node")
    try:
        return max(1, sum(1 for p in nodes.iterdir() if p.name[4:].isdigit() and p.name.startswith("node")))
    except OSError:
        return 1


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v).replace(",", ",,") for v in value)
    return str(value)


def ignored(
    values: Mapping[str, Any], found: Options, *, numa: int, gpus: int, several_nodes: bool
) -> tuple[tuple[str, str], ...]:
    """The torchrun options given that have no effect here, each with why: one entry
    per option, ``("--numa-binding node", why)``. An option at torch's default is not
    reported, nor one that means nothing on this run (a rendezvous backend on one node)."""
    out = []
    for opt in found.options:
        value = values.get(opt.dest, opt.default)
        if value == opt.default or (opt.flag and not value):
            continue
        given = opt.name if opt.flag else f"{opt.name} {_shown(value)}"
        if opt.dest not in KNOWN:
            out.append((given, f"an option of torch {found.torch} unknown to ft-supervisor: not applied"))
        elif KNOWN[opt.dest] == "ignored":
            out.append((given, WHY[opt.dest]))
        elif opt.dest == "rdzv_backend" and value == "etcd" and several_nodes:
            out.append((given, WHY["rdzv_backend=etcd"]))
        elif opt.dest == "numa_binding" and (numa < 2 or gpus == 0):
            out.append((given, WHY["numa_binding:one-node" if numa < 2 else "numa_binding:no-gpu"]))
    return tuple(out)
