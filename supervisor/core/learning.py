"""Learned timeouts: what the ranks were seen to need, times a safety factor.

The daemon sees every message, so it measures the intervals itself (no
collective in the training loop). At the end of a generation:

    new = safety_factor x (max observed over the generation's ranks)
    learned = new                      the first time
            = 0.5 new + 0.5 previous   afterwards (an EMA damps outliers)

A value is only relearned from a generation that shows what it must cover (the
rules of the Megatron integration):
  step            after at least ``min_steps`` timed iterations (warm-up excluded)
  checkpointing   after a completed save (reported: report_checkpoint("saved"))
  setup           only when a checkpoint was loaded (setup includes the load)
  other sections  once completed at least once
  heartbeat       after ``min_steps`` gaps and a completed save (heartbeats pause
                  while a checkpoint is written)
  first heartbeat only when a checkpoint was loaded
  out of section  after ``min_steps`` timed iterations and a completed save
Only what is monitored is learned: a section named in the configuration (a
None timeout there means "monitor it, learn its timeout"), and heartbeat or
out-of-section timeouts that are configured. Learning never invents a deadline
nobody asked for. A learned timeout is never below ``floor`` seconds: five
times a 10 ms step would be tripped by one garbage-collection pause.
Learned values override configured ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from supervisor.core.watch import STEP, RankWatch, Timeouts

# nvidia-resiliency-ext's examples call them init and checkpoint
SETUP = frozenset({"setup", "init"})
CHECKPOINTING = frozenset({"checkpointing", "checkpoint"})
MIN_STEPS = 16
EMA = 0.5
FLOOR = 1.0


@dataclass(frozen=True, slots=True)
class Learned:
    """Learned timeouts in seconds; None (or absent) means not learned yet."""

    initial_heartbeat: float | None = None
    heartbeat: float | None = None
    sections: Mapping[str, float] = field(default_factory=dict)
    out_of_section: float | None = None

    def over(self, configured: Timeouts) -> Timeouts:
        """The timeouts in force: learned values where there are any, for what is monitored
        (a learned value never puts a deadline where none was configured)."""
        sections = dict(configured.sections)
        sections.update({k: v for k, v in self.sections.items() if k in sections})
        return replace(
            configured,
            initial_heartbeat=_pick(self.initial_heartbeat, configured.initial_heartbeat),
            heartbeat=_pick(self.heartbeat, configured.heartbeat),
            sections=sections,
            out_of_section=_pick(self.out_of_section, configured.out_of_section),
        )

    def filled_from(self, other: Learned) -> Learned:
        """These values, with ``other``'s where these have none."""
        return Learned(
            initial_heartbeat=self.initial_heartbeat
            if self.initial_heartbeat is not None
            else other.initial_heartbeat,
            heartbeat=self.heartbeat if self.heartbeat is not None else other.heartbeat,
            sections={**other.sections, **self.sections},
            out_of_section=self.out_of_section if self.out_of_section is not None else other.out_of_section,
        )

    def describe(self, configured: Timeouts) -> dict[str, object]:
        """The timeouts in force, and which were learned: what a rank's client is told."""
        t = self.over(configured)
        return {
            "initial_heartbeat": t.initial_heartbeat,
            "heartbeat": t.heartbeat,
            "sections": dict(t.sections),
            "out_of_section": t.out_of_section,
            "warmup_iterations": t.warmup_iterations,
            "learned": self.to_json(),
        }

    def to_json(self) -> dict[str, object]:
        return {
            "initial_heartbeat": self.initial_heartbeat,
            "heartbeat": self.heartbeat,
            "sections": dict(self.sections),
            "out_of_section": self.out_of_section,
        }

    @classmethod
    def from_json(cls, data: object) -> Learned:
        """Lenient: anything malformed is simply not learned."""
        if not isinstance(data, dict):
            return cls()
        raw = data.get("sections")
        sections = raw if isinstance(raw, dict) else {}
        return cls(
            initial_heartbeat=_seconds(data.get("initial_heartbeat")),
            heartbeat=_seconds(data.get("heartbeat")),
            sections={str(k): v for k, v in ((k, _seconds(v)) for k, v in sections.items()) if v is not None},
            out_of_section=_seconds(data.get("out_of_section")),
        )


def _pick(learned: float | None, configured: float | None) -> float | None:
    return learned if learned is not None and configured is not None else configured


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value > 0 else None


@dataclass(frozen=True, slots=True)
class Observations:
    """The maxima of one generation, over all its ranks."""

    first_heartbeat: float | None = None
    heartbeat_gap: float | None = None
    heartbeat_gaps: int = 0
    sections: Mapping[str, float] = field(default_factory=dict)
    out_of_section: float | None = None
    timed_steps: int = 0
    checkpoint_loaded: bool = False
    checkpoint_saved: bool = False


def observe(watches: Iterable[RankWatch]) -> Observations:
    ws = list(watches)
    if not ws:
        return Observations()
    sections: dict[str, float] = {}
    for w in ws:
        for name, value in w.section_max.items():
            sections[name] = max(sections.get(name, 0.0), value)
    firsts = [w.first_heartbeat_delay for w in ws if w.first_heartbeat_delay is not None]
    return Observations(
        first_heartbeat=max(firsts) if firsts else None,
        heartbeat_gap=max((w.max_heartbeat_gap for w in ws if w.heartbeat_gaps), default=None),
        # the ranks of a group step together: the slowest count is what all of them showed
        heartbeat_gaps=min(w.heartbeat_gaps for w in ws),
        sections=sections,
        out_of_section=max((w.max_out_of_section for w in ws), default=0.0) or None,
        timed_steps=min(w.timed_steps for w in ws),
        checkpoint_loaded=any(w.checkpoint_loaded for w in ws),
        # only a reported save counts: an async finalisation also closes `checkpointing`
        checkpoint_saved=any(w.checkpoint_saved for w in ws),
    )


def learn(
    previous: Learned,
    obs: Observations,
    monitored: Timeouts,
    safety_factor: float,
    *,
    min_steps: int = MIN_STEPS,
    floor: float = FLOOR,
) -> Learned:
    def merge(old: float | None, seen: float | None, allowed: bool) -> float | None:
        if not allowed or seen is None or seen <= 0:
            return old
        new = max(floor, safety_factor * seen)
        return new if old is None else EMA * new + (1 - EMA) * old

    enough_steps = obs.timed_steps >= min_steps
    sections = dict(previous.sections)
    for name, seen in obs.sections.items():
        if not monitored.monitors(name):
            continue
        if name == STEP:
            allowed = enough_steps
        elif name in SETUP:
            allowed = obs.checkpoint_loaded
        elif name in CHECKPOINTING:
            allowed = obs.checkpoint_saved
        else:
            allowed = True
        value = merge(previous.sections.get(name), seen, allowed)
        if value is not None:
            sections[name] = value
    return Learned(
        initial_heartbeat=merge(
            previous.initial_heartbeat,
            obs.first_heartbeat,
            monitored.initial_heartbeat is not None and obs.checkpoint_loaded,
        ),
        heartbeat=merge(
            previous.heartbeat,
            obs.heartbeat_gap,
            monitored.heartbeat is not None and obs.heartbeat_gaps >= min_steps and obs.checkpoint_saved,
        ),
        sections=sections,
        out_of_section=merge(
            previous.out_of_section,
            obs.out_of_section,
            monitored.out_of_section is not None and enough_steps and obs.checkpoint_saved,
        ),
    )
