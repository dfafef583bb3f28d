"""A hang's diagnostic bundle, gathered before the kill (pytorch/pytorch#122694:
operators want the stacks of a hung job before it is killed, and the ranks are
gone a moment later).

Into ``<generation>/hang-bundle/``: each live rank's Python stacks (faulthandler,
already in its log) and native stacks (py-spy), NCCL's Flight Recorder dump where
the process group has one, and ``bundle.json``: the missed deadline, who was
blamed and why, and for every rank its state, open sections, last iteration and
when it was last heard from; for a hang across the job, ``job-blame.json``: every
node's summary and the job's verdict. Gathered at the same time as the Python stacks the
blame needs, within ``--ft-bundle-timeout`` (the bound on how much it may delay
the restart); written off the loop; ``reason.json`` points to it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from supervisor.clock import SYSTEM, Clock
from supervisor.core.blame import Blame
from supervisor.core.catalogue.generation import HangBundle, HangBundleUnwritable
from supervisor.core.flight import behind, enqueued, summarize
from supervisor.core.stacks import Reading
from supervisor.core.watch import Hang
from supervisor.process.native import (
    Native,
    flight_recorder,
    flight_recorder_env,
    native_stacks,
    py_spy,
    read_flight_dump,
)
from supervisor.process.spawn import RankProcess
from supervisor.process.terminate import process_state
from supervisor.runtime.lifecycle.aftermath import Seen
from supervisor.runtime.lifecycle.generation import Generation
from supervisor.runtime.lifecycle.monitor import Monitor
from supervisor.runtime.records.events import EventLog
from supervisor.runtime.records.reason import write_atomically

BUNDLE = "hang-bundle"
MANIFEST = "bundle.json"
JOB_BLAME = "job-blame.json"  # every node's summary of a job-wide hang and the verdict
WRITE_TIMEOUT = 5.0  # seconds the restart may wait for the bundle's files
SUMMARY_TIMEOUT = 1.0  # seconds the blame may wait for the Flight Recorder dumps to be read


@dataclass
class Gathered:
    """What was taken from the live ranks, by local rank."""

    native: dict[int, Native] = field(default_factory=dict)
    flight: dict[int, tuple[Path | None, str | None]] = field(default_factory=dict)
    seconds: float = 0.0  # the whole gather
    flight_seconds: float = 0.0  # the dumps alone (what the blame waits for)
    native_seconds: float = 0.0  # py-spy alone (only the bundle waits for it)


def generation_dir(gen: Generation) -> Path | None:
    rank = next(iter(gen.ranks.values()), None)
    return None if rank is None else rank.files.dir.parent


STOPPED = "the rank is stopped (SIGSTOP, or a debugger): it cannot answer, and is not woken to"
Natives = tuple[dict[int, Native], float]  # by local rank, and the seconds py-spy took


async def _no_dump(why: str) -> tuple[Path | None, str | None]:
    return None, why


def _running(rank: RankProcess) -> Callable[[], bool]:
    return lambda: rank.returncode is None


async def gather_flights(gen: Generation, timeout: float, stopped: frozenset[int] = frozenset()) -> Gathered:
    """Every live rank's Flight Recorder dump, all at once. A ``stopped`` rank (by local
    rank) is not asked: it cannot write one, and waiting for it would hold the verdict for
    the whole bound."""
    where = generation_dir(gen)
    if timeout <= 0 or where is None:
        return Gathered()
    began = SYSTEM.monotonic()
    live = [r for r in gen.ranks.values() if r.returncode is None]
    env = {**flight_recorder_env(os.environ, where), **os.environ}
    found = await asyncio.gather(
        *(
            _no_dump(STOPPED)
            if r.slot.local_rank in stopped
            else flight_recorder(env, r.slot.rank, timeout, alive=_running(r))
            for r in live
        )
    )
    took = SYSTEM.monotonic() - began
    flight = dict(zip([r.slot.local_rank for r in live], found, strict=True))
    return Gathered(flight=flight, seconds=took, flight_seconds=took)


async def gather_natives(gen: Generation, timeout: float, stopped: frozenset[int] = frozenset()) -> Natives:
    """Every live rank's native stacks (py-spy), all at once; a ``stopped`` rank's Python
    stacks only, read without waking it (``process.native.native_stacks``)."""
    if timeout <= 0 or generation_dir(gen) is None:
        return {}, 0.0
    began = SYSTEM.monotonic()
    live = [r for r in gen.ranks.values() if r.returncode is None]
    exe = py_spy()
    found = await asyncio.gather(
        *(native_stacks(r.pid, timeout, exe, stopped=r.slot.local_rank in stopped) for r in live)
    )
    return dict(zip([r.slot.local_rank for r in live], found, strict=True)), SYSTEM.monotonic() - began


def with_natives(got: Gathered, natives: Natives) -> Gathered:
    """The dumps and the native stacks, gathered side by side: the whole took the longer."""
    native, took = natives
    got.native, got.native_seconds = native, took
    got.seconds = max(got.seconds, took)
    return got


async def gather(gen: Generation, timeout: float, stopped: frozenset[int] = frozenset()) -> Gathered:
    """Native stacks and Flight Recorder dumps of every live rank, all at once."""
    got, natives = await asyncio.gather(
        gather_flights(gen, timeout, stopped), gather_natives(gen, timeout, stopped)
    )
    return with_natives(got, natives)


Flights = dict[int, tuple[list[dict[str, Any]], str | None]]  # local rank -> (summary, why none)
Dumps = dict[int, tuple[Any, str | None]]  # local rank -> (the dump as plain data, why none)


def _read(got: Gathered) -> tuple[Flights, Dumps]:
    """Each dump read as plain data and summarised (``core.flight``), by local rank."""
    out, raw = {}, {}
    for lr, (dump, _) in got.flight.items():
        if dump is not None:
            data, why = read_flight_dump(dump)
            out[lr] = (summarize(data), why)
            raw[lr] = (data, why)
    return out, raw


async def flights(got: Gathered) -> tuple[Flights, Dumps]:
    """The dumps summarised, off the loop, within ``SUMMARY_TIMEOUT`` (else none: the
    kill waits for the blame, which reads them; a 2,000-entry dump takes milliseconds);
    and as read, for the job's blame (``core.node_summary``)."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(_read, got), SUMMARY_TIMEOUT)
    except TimeoutError:
        return {}, {}


def enqueued_by_rank(summaries: Flights) -> dict[int, dict[str, int]]:
    """By local rank: the collectives enqueued per process group, for the blame."""
    return {lr: enqueued(groups) for lr, (groups, why) in summaries.items() if why is None}


def _rank_entry(
    r: RankProcess, monitor: Monitor, got: Gathered, *, seen: Seen | None, reading: Reading | None,
    stacks: str | None, now: float, flight: tuple[list[dict[str, Any]], str | None] | None,
) -> tuple[dict[str, Any], dict[str, str]]:  # fmt: skip
    lr, rank = r.slot.local_rank, r.slot.rank
    files: dict[str, str] = {}
    if stacks:
        files[f"rank{rank}.python.txt"] = stacks
    native = got.native.get(lr)
    if native is not None and native.text:
        files[f"rank{rank}.native.txt"] = native.text
    dump, dump_error = got.flight.get(lr, (None, None))
    watch = monitor.watches.get(rank)
    opened = {} if watch is None else watch.open_sections
    entry = {
        "rank": rank,
        "local_rank": lr,
        "pid": r.pid,
        "state": process_state(r.pid) if r.returncode is None else "exited",
        "returncode": r.returncode,
        "where": None if reading is None else reading.where.name.lower(),
        "iteration": None if watch is None else watch.iteration,
        "completed_steps": None if watch is None else watch.completed_steps,
        "last_heard_s_ago": None if seen is None else round(now - seen.last_seen, 3),
        "open_sections": {n: round(now - t, 3) for n, t in opened.items()},
        "python_stacks": f"rank{rank}.python.txt" if stacks else None,
        "native_stacks": f"rank{rank}.native.txt" if native is not None and native.text else None,
        "native_error": None if native is None else native.error,
        "flight_recorder": None if dump is None else str(dump),
        "flight_recorder_error": dump_error or (None if flight is None else flight[1]),
        # per process group: how far it got, the oldest collective not completed and who issued it
        "flight_recorder_summary": None if flight is None or flight[1] else flight[0],
    }
    return entry, files


def _write(where: Path, manifest: dict[str, Any], files: dict[str, str]) -> None:
    where.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        write_atomically(where / name, text.encode(errors="replace"))

    write_atomically(where / MANIFEST, orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n")


def _entries(
    gen: Generation, monitor: Monitor, got: Gathered, *, seen: dict[int, Seen],
    readings: dict[int, Reading | None], summaries: Flights, now: float,
) -> tuple[list[dict[str, Any]], dict[str, str]]:  # fmt: skip
    entries, files = [], {}
    for lr, r in sorted(gen.ranks.items()):
        entry, theirs = _rank_entry(r, monitor, got, seen=seen.get(lr), reading=readings.get(lr),
                                    stacks=gen.stacks.get(lr), now=now, flight=summaries.get(lr))  # fmt: skip
        entries.append(entry)
        files.update(theirs)
    return entries, files


async def write(
    gen: Generation, monitor: Monitor, *, missed: Hang | None, found: Blame, seen: dict[int, Seen],
    readings: dict[int, Reading | None], got: Gathered, summaries: Flights, noticed: float, clock: Clock,
    events: EventLog, job: dict[str, Any] | None = None,
) -> Path | None:  # fmt: skip
    """The bundle on disk (off the loop), and a ``hang_bundle`` event; None if it could not be written.
    ``job``: a job-wide hang's every node summary and verdict, written as ``job-blame.json``;
    ``missed`` None: no deadline was missed here (the node took part in the job's incident)."""
    root = generation_dir(gen)
    if root is None:
        return None
    now = clock.monotonic()
    entries, files = _entries(gen, monitor, got, seen=seen, readings=readings, summaries=summaries, now=now)
    summarised = [e for e in entries if e["flight_recorder_summary"]]
    counts = {e["rank"]: enqueued(e["flight_recorder_summary"]) for e in summarised}
    late = {group: ranks for group, (ranks, _, _) in behind(counts).items()}
    manifest = {
        "generation": gen.number,
        "declared_at": clock.wall() - (now - noticed),
        "deadline": None
        if missed is None
        else {
            "rank": missed.rank,
            "kind": str(missed.kind),
            "section": missed.section,
            "timeout": missed.timeout,
            "open_for": round(missed.open_for, 3),
        },
        "hung": list(found.ranks),
        "blamed_by": found.by,
        "evidence": found.detail,
        "waiting": list(found.waiting),
        "gathered_in_s": round(got.seconds, 3),
        "flight_recorder_s": round(got.flight_seconds, 3),
        "native_stacks_s": round(got.native_seconds, 3),
        # by process group: ranks that issued fewer collectives than a peer (the others wait for them)
        "flight_recorder_behind": late,
        "ranks": entries,
    }
    if job is not None:  # the verdict here; every node's summary beside it
        manifest["job_blame"] = {"file": JOB_BLAME, **job["verdict"]}
        files[JOB_BLAME] = orjson.dumps(job, option=orjson.OPT_INDENT_2).decode() + "\n"
    return await _store(gen, root / BUNDLE, manifest, files=files, got=got, late=late, events=events)


async def write_lingering(
    gen: Generation, monitor: Monitor, *, lingering: list[dict[str, Any]],
    readings: dict[int, Reading | None], got: Gathered, noticed: float, clock: Clock, events: EventLog,
) -> Path | None:  # fmt: skip
    """The bundle of ranks that outlived their peers' successful exit (``lingering``:
    what was found of each, supervisor.core.lingering), as a hang's."""
    root = generation_dir(gen)
    if root is None:
        return None
    now = clock.monotonic()
    entries, files = _entries(gen, monitor, got, seen={}, readings=readings, summaries={}, now=now)
    manifest = {
        "generation": gen.number,
        "declared_at": clock.wall() - (now - noticed),
        "exit_stuck": lingering,
        "gathered_in_s": round(got.seconds, 3),
        "ranks": entries,
    }
    return await _store(gen, root / BUNDLE, manifest, files=files, got=got, late={}, events=events)


async def _store(
    gen: Generation, where: Path, manifest: dict[str, Any], *, files: dict[str, str], got: Gathered,
    late: dict[str, Any], events: EventLog,
) -> Path | None:  # fmt: skip
    entries = manifest["ranks"]
    try:
        # a run directory on a stalled file system must not hold the restart: the
        # thread may finish later, the restart does not wait for it
        await asyncio.wait_for(asyncio.to_thread(_write, where, manifest, files), WRITE_TIMEOUT)
    except (OSError, TimeoutError) as exc:
        why = f"not written within {WRITE_TIMEOUT:g} s" if isinstance(exc, TimeoutError) else exc.strerror
        events.emit(HangBundleUnwritable(generation=gen.number, path=str(where),
                                         error=why or str(exc)))  # fmt: skip
        return None
    events.emit(
        HangBundle(
            generation=gen.number,
            path=str(where),
            ranks=len(entries),
            native=sum(1 for e in entries if e["native_stacks"]),
            native_error=next((e["native_error"] for e in entries if e["native_error"]), None),
            flight_recorder=sum(1 for e in entries if e["flight_recorder"]),
            flight_recorder_behind=late or None,
            seconds=round(got.seconds, 3),
        ),
    )
    return where
