"""Learned timeouts: what the ranks were seen to need, times a safety factor.

The daemon sees every message, so it measures the intervals itself (no
collective in the training loop). A value is learned as

    new = safety_factor x (the longest interval observed over the node's ranks)
    learned = new                      the first time
            = 0.5 new + 0.5 previous   afterwards (an EMA damps outliers)

**Only healthy intervals are observations.** An interval that was still open
when trouble began (a hang, a failure, a stop) ended because of the trouble, not
because the work needed that long: the runtime passes the moment trouble began
and only intervals that ended before it count (``observe(..., before=...)``). A
section the client closed because an exception went through it does not count
either.

**When it is learned.** At the end of every generation, from what it showed,
only where the generation shows what a value must cover (the rules of the
Megatron integration):
  step            after at least ``min_steps`` timed iterations (warm-up excluded)
  checkpointing   after a completed save (reported: report_checkpoint("saved"))
  setup           only when a checkpoint was loaded (setup includes the load)
  other sections  once completed at least once
  heartbeat       after ``min_steps`` gaps and a completed save (heartbeats pause
                  while a checkpoint is written)
  first heartbeat only when a checkpoint was loaded
  out of section  after ``min_steps`` timed iterations and a completed save
Or at once, when the workload asks (nvidia-resiliency-ext's
``calculate_and_set_*_timeouts``, through ``supervisor.client.nvrx``): from what
this generation showed so far, merged with the value in force when it started.
Values the workload calculated are its own from then on (``asked``): the
end-of-generation rules leave them alone.

**What is in force** (``Learned.over``):
  * a timeout configured as a number is the user's: learning only ever raises it,
    when healthy intervals came close to it; it never tightens it, unless the
    workload itself asked for the calculation (nvidia-resiliency-ext's rule:
    calculated values take precedence);
  * a timeout configured as none (``step:none``; a null heartbeat timeout in an
    nvidia-resiliency-ext config) means "learn it": nothing is enforced until a
    value is learned (for heartbeats: until the workload asks), then the learned
    value is;
  * a learned value in force is never below ``Timeouts.learned_floor``
    (``--ft-learned-timeout-floor``, 10 s): a garbage-collection pause, a data
    stall or a busy node must not end a healthy rank;
  * learning never puts a deadline where none was configured or asked for.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from supervisor.core.watch import STEP, RankWatch, Timeouts

# nvidia-resiliency-ext's examples call them init and checkpoint
SETUP = frozenset({"setup", "init"})
CHECKPOINTING = frozenset({"checkpointing", "checkpoint"})
MIN_STEPS = 16
EMA = 0.5
MAX_TIMEOUT = 24 * 3600.0  # seconds; what a state file or a message may set
# the keys of the non-section timeouts, as in ``Learned.asked``
INITIAL_HEARTBEAT, HEARTBEAT, OUT_OF_SECTION = "initial_heartbeat", "heartbeat", "out_of_section"


def section_key(name: str) -> str:
    return f"section:{name}"


@dataclass(frozen=True, slots=True)
class Learned:
    """Learned timeouts in seconds (safety factor x what was seen; no floor applied);
    None (or absent) means not learned yet. ``asked`` holds the keys the workload
    calculated itself (``heartbeat``, ``section:step``...)."""

    initial_heartbeat: float | None = None
    heartbeat: float | None = None
    sections: Mapping[str, float] = field(default_factory=dict)
    out_of_section: float | None = None
    asked: frozenset[str] = frozenset()

    def over(self, configured: Timeouts) -> Timeouts:
        """The timeouts in force (see the module's docstring)."""
        floor = configured.learned_floor

        def pick(key: str, learned: float | None, setting: float | None, monitored: bool) -> float | None:
            if learned is None or not monitored:
                return setting
            if setting is not None and key not in self.asked:
                return max(setting, learned)  # the user's value: only ever raised
            return max(floor, learned)

        sections = {
            name: pick(section_key(name), self.sections.get(name), setting, True)
            for name, setting in configured.sections.items()
        }
        return replace(
            configured,
            initial_heartbeat=pick(
                INITIAL_HEARTBEAT, self.initial_heartbeat, configured.initial_heartbeat,
                configured.initial_heartbeat is not None or INITIAL_HEARTBEAT in self.asked,
            ),
            heartbeat=pick(
                HEARTBEAT, self.heartbeat, configured.heartbeat,
                configured.heartbeat is not None or HEARTBEAT in self.asked,
            ),
            sections=sections,
            out_of_section=pick(
                OUT_OF_SECTION, self.out_of_section, configured.out_of_section,
                configured.out_of_section is not None or OUT_OF_SECTION in self.asked,
            ),
        )  # fmt: skip

    def filled_from(self, other: Learned) -> Learned:
        """These values, with ``other``'s where these have none (and its ``asked`` for those)."""
        mine = self.keys()
        return Learned(
            initial_heartbeat=self.initial_heartbeat
            if self.initial_heartbeat is not None
            else other.initial_heartbeat,
            heartbeat=self.heartbeat if self.heartbeat is not None else other.heartbeat,
            sections={**other.sections, **self.sections},
            out_of_section=self.out_of_section if self.out_of_section is not None else other.out_of_section,
            asked=self.asked | {k for k in other.asked if k not in mine},
        )

    def keys(self) -> set[str]:
        """The keys (as in ``asked``) that have a learned value."""
        keys = {section_key(name) for name in self.sections}
        for key, value in (
            (INITIAL_HEARTBEAT, self.initial_heartbeat),
            (HEARTBEAT, self.heartbeat),
            (OUT_OF_SECTION, self.out_of_section),
        ):
            if value is not None:
                keys.add(key)
        return keys

    def describe(self, configured: Timeouts) -> dict[str, object]:
        """The timeouts in force, and which were learned: what a rank's client is told."""
        t = self.over(configured)
        return {
            "initial_heartbeat": t.initial_heartbeat,
            "heartbeat": t.heartbeat,
            "sections": dict(t.sections),
            "out_of_section": t.out_of_section,
            "warmup_iterations": t.warmup_iterations,
            "learned_floor": t.learned_floor,
            "learned": self.to_json(),
        }

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "initial_heartbeat": self.initial_heartbeat,
            "heartbeat": self.heartbeat,
            "sections": dict(self.sections),
            "out_of_section": self.out_of_section,
        }
        if self.asked:
            out["asked"] = sorted(self.asked)
        return out

    @classmethod
    def from_json(cls, data: object) -> Learned:
        """Lenient: anything malformed is simply not learned."""
        if not isinstance(data, dict):
            return cls()
        raw = data.get("sections")
        sections = raw if isinstance(raw, dict) else {}
        asked = data.get("asked")
        return cls(
            initial_heartbeat=_seconds(data.get("initial_heartbeat")),
            heartbeat=_seconds(data.get("heartbeat")),
            sections={str(k): v for k, v in ((k, _seconds(v)) for k, v in sections.items()) if v is not None},
            out_of_section=_seconds(data.get("out_of_section")),
            asked=frozenset(str(k) for k in asked if isinstance(k, str))
            if isinstance(asked, list)
            else frozenset(),
        )


def _seconds(value: object) -> float | None:
    """A timeout from a state file or a rank's message: anything but 0 < value <= a day is
    refused (a "timeout" of 1e308 s would switch hang detection off)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 < value <= MAX_TIMEOUT else None


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


def observe(watches: Iterable[RankWatch], before: float | None = None) -> Observations:
    """What the ranks showed in intervals that ended before ``before`` (monotonic; None:
    all of them): the moment trouble began, when a generation ends in trouble."""
    ws = list(watches)
    if not ws:
        return Observations()
    seen = [w.seen(before) for w in ws]
    sections: dict[str, float] = {}
    for s in seen:
        for name, value in s.sections.items():
            sections[name] = max(sections.get(name, 0.0), value)
    firsts = [s.first_heartbeat for s in seen if s.first_heartbeat is not None]
    return Observations(
        first_heartbeat=max(firsts) if firsts else None,
        heartbeat_gap=max((s.heartbeat_gap for s in seen if s.heartbeat_gaps), default=None),
        # the ranks of a group step together: the slowest count is what all of them showed
        heartbeat_gaps=min(s.heartbeat_gaps for s in seen),
        sections=sections,
        out_of_section=max((s.out_of_section for s in seen), default=0.0) or None,
        timed_steps=min(s.timed_steps for s in seen),
        checkpoint_loaded=any(w.checkpoint_loaded for w in ws),
        # only a reported save counts: an async finalisation also closes `checkpointing`
        checkpoint_saved=any(w.checkpoint_saved for w in ws),
    )


def _merge(old: float | None, seen: float | None, safety_factor: float) -> float | None:
    if seen is None or seen <= 0:
        return old
    new = safety_factor * seen
    return new if old is None else EMA * new + (1 - EMA) * old


def learn(
    previous: Learned,
    obs: Observations,
    monitored: Timeouts,
    safety_factor: float,
    *,
    min_steps: int = MIN_STEPS,
) -> Learned:
    """The end-of-generation rules; keys the workload calculated itself are left alone."""
    asked = previous.asked

    def merge(key: str, old: float | None, seen: float | None, allowed: bool) -> float | None:
        return _merge(old, seen, safety_factor) if allowed and key not in asked else old

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
        value = merge(section_key(name), previous.sections.get(name), seen, allowed)
        if value is not None:
            sections[name] = value
    return replace(
        previous,
        initial_heartbeat=merge(
            INITIAL_HEARTBEAT, previous.initial_heartbeat, obs.first_heartbeat,
            monitored.initial_heartbeat is not None and obs.checkpoint_loaded,
        ),
        heartbeat=merge(
            HEARTBEAT, previous.heartbeat, obs.heartbeat_gap,
            monitored.heartbeat is not None and obs.heartbeat_gaps >= min_steps and obs.checkpoint_saved,
        ),
        sections=sections,
        out_of_section=merge(
            OUT_OF_SECTION, previous.out_of_section, obs.out_of_section,
            monitored.out_of_section is not None and enough_steps and obs.checkpoint_saved,
        ),
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Calculation:
    """What the workload asked to calculate now (nvidia-resiliency-ext's two calls)."""

    heartbeat: bool = False
    sections: Collection[str] | None = None  # None with sections_too: every monitored one
    sections_too: bool = False
    out_of_section: bool = False


def calculate(
    base: Learned, current: Learned, obs: Observations, monitored: Timeouts, ask: Calculation,
    *, safety_factor: float,
) -> Learned | None:  # fmt: skip
    """The workload's own calculation, from what this generation showed so far, merged
    with ``base`` (what was in force when the generation started, so that asking twice
    in a generation does not compound). None when something asked for was not seen yet
    (nvidia-resiliency-ext's "not enough data")."""
    updates: dict[str, float | None] = {}
    sections = dict(current.sections)
    asked = set(current.asked)
    if ask.heartbeat:
        if obs.first_heartbeat is None or obs.heartbeat_gap is None:
            return None
        updates[INITIAL_HEARTBEAT] = _merge(base.initial_heartbeat, obs.first_heartbeat, safety_factor)
        updates[HEARTBEAT] = _merge(base.heartbeat, obs.heartbeat_gap, safety_factor)
        asked |= {INITIAL_HEARTBEAT, HEARTBEAT}
    if ask.sections_too:
        names = list(monitored.sections) if ask.sections is None else list(ask.sections)
        if any(name not in obs.sections or not monitored.monitors(name) for name in names):
            return None
        for name in names:
            value = _merge(base.sections.get(name), obs.sections[name], safety_factor)
            if value is not None:
                sections[name] = value
                asked.add(section_key(name))
    if ask.out_of_section:
        if obs.out_of_section is None:
            return None
        updates[OUT_OF_SECTION] = _merge(base.out_of_section, obs.out_of_section, safety_factor)
        asked.add(OUT_OF_SECTION)
    return replace(
        current,
        initial_heartbeat=updates.get(INITIAL_HEARTBEAT, current.initial_heartbeat),
        heartbeat=updates.get(HEARTBEAT, current.heartbeat),
        sections=sections,
        out_of_section=updates.get(OUT_OF_SECTION, current.out_of_section),
        asked=frozenset(asked),
    )
