"""What the daemon knows about a live rank, and when that rank counts as hung.

Semantics follow nvidia-resiliency-ext's fault-tolerance package:

* heartbeats: ``initial_heartbeat`` bounds the time from the client's hello to its
  first heartbeat, ``heartbeat`` the gap between two heartbeats;
* sections: a monitored section (its name is in ``sections``) may stay open for
  its timeout (None: monitored, no timeout until one is learned); sections may
  overlap, not repeat;
* out of section: while no monitored section is open, ``out_of_section`` bounds
  the time since the last sign of life: a section closing, a heartbeat, an
  iteration report (or the hello). So a workload without sections that reports
  its iterations is held to it too. A workload that uses sections is not held
  to it until it has opened ``step`` once: setup and warm-up run outside sections;
* warm-up: the first ``warmup_iterations`` openings of ``step`` in a generation
  are not held to the ``step`` timeout (a ``warmup`` pseudo-section timeout
  applies to them instead, when configured).

Everything here is pure: time comes in as ``now``. The daemon asks for the next
deadline after each message and arms one timer for it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

STEP = "step"
WARMUP = "warmup"


class HangKind(StrEnum):
    INITIAL_HEARTBEAT = "initial_heartbeat"
    HEARTBEAT = "heartbeat"
    SECTION = "section"
    OUT_OF_SECTION = "out_of_section"


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds; None means no timeout. ``sections`` lists the monitored names."""

    initial_heartbeat: float | None = None
    heartbeat: float | None = None
    sections: Mapping[str, float | None] = field(default_factory=dict)
    out_of_section: float | None = None
    warmup_iterations: int = 0
    # a learned timeout in force is never shorter (see supervisor.core.learning)
    learned_floor: float = 10.0

    def monitors(self, section: str) -> bool:
        return section in self.sections


Paused = Sequence[tuple[float, float]]  # intervals the daemon was stalled (monotonic)


def _stalled_since(paused: Paused, since: float) -> float:
    """How long the daemon was stalled after ``since``."""
    return sum(max(0.0, end - max(start, since)) for start, end in paused)


@dataclass(frozen=True, slots=True)
class Deadline:
    at: float
    kind: HangKind
    since: float  # when the watched interval began
    timeout: float
    section: str | None = None


@dataclass(frozen=True, slots=True)
class Hang:
    """A rank declared hung: the interval it was in, and by how much a deadline was missed.

    ``late_by`` is how late the missed deadline was noticed. When the rank was named
    by the evidence (its stacks, its progress) after another rank's deadline fired,
    ``deadline_rank`` is that rank and ``evidence`` says what told them apart.
    """

    rank: int
    kind: HangKind
    section: str | None
    timeout: float | None
    open_for: float  # how long the interval had lasted when it was noticed
    late_by: float  # noticed this long after the deadline
    deadline_rank: int | None = None
    evidence: str = ""

    def describe(self) -> str:
        what = {
            HangKind.INITIAL_HEARTBEAT: "no first heartbeat",
            HangKind.HEARTBEAT: "no heartbeat",
            HangKind.SECTION: f"section {self.section!r} open",
            HangKind.OUT_OF_SECTION: "outside any section",
        }[self.kind]
        timeout = "no timeout" if self.timeout is None else f"timeout {self.timeout:g} s"
        said = f"rank {self.rank}: {what} for {self.open_for:.3f} s ({timeout})"
        if self.deadline_rank is not None and self.deadline_rank != self.rank:
            said += f"; rank {self.deadline_rank}'s deadline was missed first"
        return f"{said}; {self.evidence}" if self.evidence else said


@dataclass
class Seen:
    """What a rank was seen to need, as maxima and counts: what timeouts are learned from."""

    first_heartbeat: float | None = None
    heartbeat_gap: float = 0.0
    heartbeat_gaps: int = 0
    sections: dict[str, float] = field(default_factory=dict)
    section_count: dict[str, int] = field(default_factory=dict)
    out_of_section: float = 0.0
    timed_steps: int = 0  # step sections closed outside warm-up

    def add(self, kind: str, name: str | None, duration: float) -> None:
        if kind == FIRST_HEARTBEAT:
            self.first_heartbeat = duration
        elif kind == HEARTBEAT_GAP:
            self.heartbeat_gap = max(self.heartbeat_gap, duration)
            self.heartbeat_gaps += 1
        elif kind == OUT_OF_SECTION:
            self.out_of_section = max(self.out_of_section, duration)
        elif name is not None:
            self.sections[name] = max(self.sections.get(name, 0.0), duration)
            self.section_count[name] = self.section_count.get(name, 0) + 1
            if name == STEP:
                self.timed_steps += 1

    def copy(self) -> Seen:
        return replace(self, sections=dict(self.sections), section_count=dict(self.section_count))


FIRST_HEARTBEAT, HEARTBEAT_GAP, SECTION, OUT_OF_SECTION = "first_heartbeat", "heartbeat", "section", "oos"
# Observations kept apart with their end times, so that those which ended once
# trouble had begun can be left out of learning. Older ones are folded in: a rank
# that went on this long after trouble began was not held up by it.
PENDING = 512


@dataclass
class RankWatch:
    """One rank's monitored activity in one generation, and what was observed of it."""

    rank: int
    started: float  # the client's hello
    last_heartbeat: float | None = None
    last_seen: float | None = None  # any message: who fell silent first
    open_sections: dict[str, float] = field(default_factory=dict)
    out_of_section_since: float | None = None
    step_opens: int = 0
    completed_steps: int = 0  # step sections closed, warm-up included: progress
    iteration: int | None = None
    checkpoint_loaded: bool = False
    checkpoint_saved: bool = False
    closed: bool = False  # the rank said bye: no more deadlines, observations kept
    _seen: Seen = field(default_factory=Seen, init=False, repr=False)
    _pending: deque[tuple[float, str, str | None, float]] = field(
        default_factory=deque, init=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.out_of_section_since is None:
            self.out_of_section_since = self.started
        if self.last_seen is None:
            self.last_seen = self.started

    # -- what the rank says -------------------------------------------------------------

    def heartbeat(self, now: float) -> None:
        if self.last_heartbeat is None:
            self._note(now, FIRST_HEARTBEAT, None, now - self.started)
        else:
            self._note(now, HEARTBEAT_GAP, None, now - self.last_heartbeat)
        self.last_heartbeat = now
        self._alive(now)

    def report_iteration(self, iteration: int, now: float) -> None:
        self.iteration = iteration
        self._alive(now)

    def _alive(self, now: float) -> None:
        """A sign of life outside sections restarts the out-of-section interval."""
        if not self.open_sections and self.out_of_section_since is not None:
            self._note(now, OUT_OF_SECTION, None, now - self.out_of_section_since)
            self.out_of_section_since = now

    def open_section(self, name: str, now: float) -> bool:
        """False when ``name`` is already open (the old opening stands)."""
        if name in self.open_sections:
            return False
        if not self.open_sections and self.out_of_section_since is not None:
            self._note(now, OUT_OF_SECTION, None, now - self.out_of_section_since)
            self.out_of_section_since = None
        self.open_sections[name] = now
        if name == STEP:
            self.step_opens += 1
        return True

    def close_section(self, name: str, now: float, timeouts: Timeouts, *, failed: bool = False) -> bool:
        """False when ``name`` was not open. ``failed``: an exception ended it, so its
        length says how long the failure took to surface, not what the section needs."""
        opened = self.open_sections.pop(name, None)
        if opened is None:
            return False
        if name == STEP:
            self.completed_steps += not failed
        # warm-up steps are slow on purpose: they teach nothing about `step`
        if not failed and not (name == STEP and self.in_warmup(timeouts)):
            self._note(now, SECTION, name, now - opened)
        if not self.open_sections:
            self.out_of_section_since = now
        return True

    def close_all(self, now: float, timeouts: Timeouts, *, failed: bool = False) -> None:
        for name in list(self.open_sections):
            self.close_section(name, now, timeouts, failed=failed)

    # -- what it showed ---------------------------------------------------------------

    def _note(self, end: float, kind: str, name: str | None, duration: float) -> None:
        self._pending.append((end, kind, name, duration))
        if len(self._pending) > PENDING:
            _, old_kind, old_name, old_duration = self._pending.popleft()
            self._seen.add(old_kind, old_name, old_duration)

    def seen(self, before: float | None = None) -> Seen:
        """What the rank showed in intervals that ended before ``before`` (all: None)."""
        out = self._seen.copy()
        for end, kind, name, duration in self._pending:
            if before is None or end < before:
                out.add(kind, name, duration)
        return out

    def in_warmup(self, timeouts: Timeouts) -> bool:
        return self.step_opens <= timeouts.warmup_iterations

    # -- deadlines --------------------------------------------------------------------

    def deadline(self, timeouts: Timeouts, paused: Paused = ()) -> Deadline | None:
        """The earliest deadline this rank must meet next, or None. ``paused``: when the
        daemon itself was stalled (monotonic intervals): a timeout counts time the daemon
        was awake, so a deadline moves by the stall that overlaps its interval."""
        if self.closed:
            return None
        candidates = [d for d in self._deadlines(timeouts) if d is not None]
        if not candidates:
            return None
        d = min(candidates, key=lambda d: d.at + _stalled_since(paused, d.since))
        return replace(d, at=d.at + _stalled_since(paused, d.since))

    def _deadlines(self, t: Timeouts) -> list[Deadline | None]:
        found: list[Deadline | None] = [self._heartbeat_deadline(t), self._out_of_section_deadline(t)]
        for name, opened in self.open_sections.items():
            timeout = self._section_timeout(name, t)
            if timeout is not None:
                found.append(Deadline(opened + timeout, HangKind.SECTION, opened, timeout, name))
        return found

    def _heartbeat_deadline(self, t: Timeouts) -> Deadline | None:
        if self.last_heartbeat is None:
            if t.initial_heartbeat is None:
                return None
            return Deadline(
                self.started + t.initial_heartbeat,
                HangKind.INITIAL_HEARTBEAT,
                self.started,
                t.initial_heartbeat,
            )
        if t.heartbeat is None:
            return None
        return Deadline(
            self.last_heartbeat + t.heartbeat, HangKind.HEARTBEAT, self.last_heartbeat, t.heartbeat
        )

    def _section_timeout(self, name: str, t: Timeouts) -> float | None:
        if name == STEP and self.in_warmup(t):
            return t.sections.get(WARMUP)
        return t.sections.get(name)

    def _out_of_section_deadline(self, t: Timeouts) -> Deadline | None:
        if t.out_of_section is None or self.open_sections or self.out_of_section_since is None:
            return None
        if t.sections and self.step_opens == 0:
            return None  # setup and warm-up come first, outside sections
        since = self.out_of_section_since
        return Deadline(since + t.out_of_section, HangKind.OUT_OF_SECTION, since, t.out_of_section)

    def expired(self, timeouts: Timeouts, now: float, paused: Paused = ()) -> Hang | None:
        """The hang, if the earliest deadline has passed by ``now``."""
        d = self.deadline(timeouts, paused)
        if d is None or now < d.at:
            return None
        return Hang(self.rank, d.kind, d.section, d.timeout, now - d.since, now - d.at)

    def current(self, timeouts: Timeouts, now: float, paused: Paused = ()) -> Hang:
        """The interval the rank is in at ``now``, as a hang: what a rank named by the
        evidence is declared hung in, whether or not its own deadline has passed."""
        d = self.deadline(timeouts, paused)
        if d is not None:
            return Hang(self.rank, d.kind, d.section, d.timeout, now - d.since, now - d.at)
        if self.open_sections:
            name, opened = min(self.open_sections.items(), key=lambda item: item[1])
            return Hang(self.rank, HangKind.SECTION, name, None, now - opened, 0.0)
        since = self.out_of_section_since if self.out_of_section_since is not None else self.started
        return Hang(self.rank, HangKind.OUT_OF_SECTION, None, None, now - since, 0.0)
