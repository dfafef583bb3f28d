"""Which rank is stuck, once a deadline was missed.

A missed deadline says that *some* rank of a synchronous job stopped, not which:
when one rank hangs inside a step, its peers block in the next collective with
their own step open, and whichever opened the step first misses its deadline
first. Killing that one kills a healthy rank. So the daemon looks at every rank
before it names one, evidence by evidence, the first that tells them apart:

0. **NCCL's Flight Recorder** (``supervisor.core.flight``), where the ranks' process
   groups keep one and at least two ranks answered: a rank that issued fewer
   collectives in a group than its peers is the one they wait for, whatever its
   stacks say (a peer waiting at ``.item()`` looks like its own code to the stacks;
   a rank stuck inside backward looks like a waiting one). A stopped rank cannot
   answer, so it never takes part here, and rule 1 finds it.
1. **stacks** (``supervisor.core.stacks``): a stopped process or one that never
   answered the dump is the most suspect; then a rank in its own code (data
   loading, I/O, a sleep); then one inside backward (DDP waits for its
   all-reduce there); ranks inside a collective wait for the others. The least
   waiting ranks are blamed. With three or more ranks at the same level, a
   minority whose innermost frames differ from what the majority share is
   blamed (healthy ranks wait at the same place).
2. **progress**: the ranks whose last reported iteration is behind the others',
   or whose last message is much older than every other rank's.
3. **the deadline** itself: the rank whose deadline was missed, any other whose
   own deadline has passed by now, and any other not waiting in a collective that
   has been silent for half the missed timeout or more (a rank of a job without
   collectives that keeps reporting is not stuck). The ranks could not be told
   apart, and the event says so.

Ranks without stacks (no client, or no faulthandler) take part only in 2 and 3;
when every rank that answered is waiting in a collective, those are blamed.

Pure: the runtime gathers the stacks and calls ``blame`` with the time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from supervisor.core.flight import behind
from supervisor.core.stacks import Reading, Where
from supervisor.core.watch import Hang

# a silence counts as evidence only when it is this much longer than every other
# rank's: ranks of a synchronous job fall silent within a step of each other
SILENCE_MARGIN = 0.5  # x the missed deadline's timeout
MIN_SILENCE = 1.0  # seconds


@dataclass(frozen=True, slots=True)
class Suspect:
    """One live rank of the generation, as the daemon saw it at the missed deadline."""

    rank: int
    reading: Reading | None  # its main thread, from its stack dump; None: no dump
    last_seen: float  # monotonic time of its last message
    iteration: int | None = None
    hang: Hang | None = None  # its own deadline, if that has passed by now
    # collectives it enqueued, by process group (its Flight Recorder dump); None: no dump
    enqueued: Mapping[str, int] | None = None


@dataclass(frozen=True, slots=True)
class Blame:
    """The ranks declared hung and why."""

    ranks: tuple[int, ...]  # the first is the root cause
    by: str  # flight_recorder | stacks | progress | deadline
    waiting: tuple[int, ...]  # ranks seen waiting for the others (in a collective)
    detail: str
    undetermined: bool = False  # several ranks could have been the stuck one


def blame(suspects: Sequence[Suspect], missed: Hang, now: float) -> Blame:
    """Name the stuck rank(s); ``missed`` is the deadline that fired at ``now``."""
    by_rank = {s.rank: s for s in suspects}
    if len(suspects) <= 1:
        return Blame((missed.rank,), "deadline", (), "the only live rank of this node")
    waiting = tuple(sorted(s.rank for s in suspects if s.reading and s.reading.where is Where.COLLECTIVE))
    for judge in (_by_flight_recorder, _by_level, _by_odd_one_out, _by_iteration, _by_silence):
        found = judge(suspects, missed)
        if found is not None:
            ranks, detail = found
            return Blame(_root_first(ranks, by_rank, missed), _kind(judge), waiting, detail)
    quiet = SILENCE_MARGIN * (missed.timeout or 0.0)
    expired = sorted(
        {missed.rank}
        | {s.rank for s in suspects if s.hang is not None}
        | {s.rank for s in suspects if now - s.last_seen >= quiet and not _waits(s)}
    )
    detail = "the ranks could not be told apart"
    if suspects and len(waiting) == len(suspects):
        detail = "every rank of this node waits in a collective: the stuck rank is elsewhere"
    return Blame(_root_first(expired, by_rank, missed), "deadline", waiting, detail, undetermined=True)


def _waits(s: Suspect) -> bool:
    return s.reading is not None and s.reading.where is Where.COLLECTIVE


def _kind(judge: object) -> str:
    if judge is _by_flight_recorder:
        return "flight_recorder"
    return "stacks" if judge in (_by_level, _by_odd_one_out) else "progress"


def _root_first(ranks: Sequence[int], by_rank: dict[int, Suspect], missed: Hang) -> tuple[int, ...]:
    """The root cause first: the rank silent longest (the missed deadline's on a tie)."""

    def key(rank: int) -> tuple[float, int, int]:
        s = by_rank.get(rank)
        return (s.last_seen if s is not None else float("-inf"), rank != missed.rank, rank)

    return tuple(sorted(set(ranks), key=key))


Found = tuple[list[int], str] | None


def _by_flight_recorder(suspects: Sequence[Suspect], missed: Hang) -> Found:
    dumps = {s.rank: s.enqueued for s in suspects if s.enqueued is not None}
    found = behind(dumps) if len(dumps) >= 2 else {}
    late = {r for ranks, _, _ in found.values() for r in ranks}
    if not late or late == set(dumps):
        return None  # nothing to tell, or every rank behind somewhere: no verdict
    said = [f"group {g}: rank(s) {_list(ranks)} issued {fewest} collectives, others {most}"
            for g, (ranks, fewest, most) in found.items()]  # fmt: skip
    return sorted(late), "; ".join(said) + ": the others wait for it"


def _by_level(suspects: Sequence[Suspect], missed: Hang) -> Found:
    read = [s for s in suspects if s.reading is not None]
    levels = {s.rank: s.reading.where for s in read if s.reading is not None}
    if not levels:
        return None
    low = min(levels.values())
    if low == max(levels.values()):
        # all alike; if all of them wait, whoever did not answer is the one they wait for
        unread = [s.rank for s in suspects if s.reading is None]
        if low is Where.COLLECTIVE and unread:
            return unread, f"rank(s) {_list(levels)} wait in a collective; no stacks from {_list(unread)}"
        return None
    stuck = sorted(r for r, w in levels.items() if w is low)
    why = "; ".join(f"rank {s.rank}: {_where(s)}" for s in sorted(read, key=lambda s: s.rank))
    return stuck, why


def _by_odd_one_out(suspects: Sequence[Suspect], missed: Hang) -> Found:
    read = [s for s in suspects if s.reading is not None]
    if len(read) < 3:
        return None
    shared = Counter(s.reading.signature for s in read if s.reading is not None)
    (common, count), *rest = shared.most_common()
    if count * 2 <= len(read) or not rest:
        return None
    odd = sorted(s.rank for s in read if s.reading is not None and s.reading.signature != common)
    first = next(s for s in read if s.reading is not None and s.reading.signature == common)
    return odd, f"{count} of {len(read)} ranks stand at {_where(first)}; rank(s) {_list(odd)} elsewhere"


def _by_iteration(suspects: Sequence[Suspect], missed: Hang) -> Found:
    known = {s.rank: s.iteration for s in suspects if s.iteration is not None}
    if len(known) < 2 or len(set(known.values())) < 2:
        return None
    low = min(v for v in known.values() if v is not None)
    behind = sorted(r for r, v in known.items() if v == low)
    ahead = max(v for v in known.values() if v is not None)
    return behind, f"rank(s) {_list(behind)} at iteration {low}, others up to {ahead}"


def _by_silence(suspects: Sequence[Suspect], missed: Hang) -> Found:
    if len(suspects) < 2:
        return None
    ordered = sorted(suspects, key=lambda s: s.last_seen)
    oldest, others = ordered[0], ordered[1:]
    gap = min(s.last_seen for s in others) - oldest.last_seen
    if gap < max(MIN_SILENCE, SILENCE_MARGIN * (missed.timeout or 0.0)):
        return None
    return [oldest.rank], f"rank {oldest.rank} fell silent {gap:.1f} s before any other rank"


def _where(s: Suspect) -> str:
    r = s.reading
    if r is None:
        return "no stacks"
    if r.where is Where.STOPPED:
        return r.why
    return f"{r.where.name.lower()} ({r.why})"


def _list(ranks: Iterable[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))
