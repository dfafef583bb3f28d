"""Events of a generation (one start of the ranks) and of the decision that ends it."""

from __future__ import annotations

from supervisor.core.catalogue.base import ERROR, WARNING, Event


class GenerationStarted(Event, name="generation_started"):
    """A generation's ranks were started."""

    generation: int
    master_addr: str
    master_port: int
    node_rank: int | None
    nnodes: int | None
    standby_ranks: int
    standby_ready: int


class GenerationEnded(Event, name="generation_ended"):
    """A generation's ranks are all gone: how it ended and how they were stopped."""

    generation: int
    result: str
    signalled: int
    killed: int
    swept: int | None
    seconds: float
    iteration: int | None


class Decision(Event, name="decision", level=WARNING):
    """What the daemon decided after a failure: the action, the reason, the rule that matched."""

    generation: int
    action: str
    reason: str
    detail: str
    rule: str | None
    category: str | None
    rank: int | None
    classifier: str | None
    lines: list[str] | None
    restarts_used: int


class Containment(Event, name="containment"):
    """How the ranks are contained: a cgroup of their own, or the fallback and why."""

    generation: int | None = None
    mode: str  # cgroup | fallback
    why: str | None = None
    cgroup: str | None = None
    kill: str | None = None


class CgroupNotEmpty(Event, name="cgroup_not_empty", level=ERROR):
    """Processes remained in a generation's cgroup after it ended."""

    generation: int
    cgroup: str
    pids: list[int]


class ForkServer(Event, name="fork_server"):
    """Whether ranks are forked from a preloaded server (on), or spawned and why (off)."""

    mode: str  # on | off
    pid: int | None = None
    modules: list[str] | None = None
    seconds: float | None = None
    why: str | None = None


class ForkServerLost(Event, name="fork_server_lost", level=WARNING):
    """The fork server died: ranks are spawned instead."""

    pid: int
    returncode: int | None
    error: str


class StandbyReady(Event, name="standby_ready"):
    """Standby ranks for the next generation are started and waiting."""

    generation: int
    ranks: int
    seconds: float
    priority: str
    start: str = "after_steps"  # with_generation where the node's idle cores allowed (core.standby_start)
    idle_cores: float | None = None  # this process's CPUs less their share of the load, at the launch


class StandbyFailed(Event, name="standby_failed", level=WARNING):
    """Standby ranks could not be started (the next generation spawns afresh)."""

    generation: int
    error: str
    path: str | None


class SpawnFailed(Event, name="spawn_failed", level=ERROR):
    """A rank's program could not be started."""

    generation: int
    error: str
    path: str | None


class RestartRequested(Event, name="restart_requested"):
    """An operator asked for a restart of the current generation."""

    generation: int


class TimeoutsLearned(Event, name="timeouts_learned"):
    """The timeouts learned in a generation, and those in force after it."""

    generation: int
    learned: dict[str, object]
    in_force: dict[str, object]


class KernelLines(Event, name="kernel_lines", quiet=("lines",)):
    """Kernel log lines (Xid, OOM killer, segfaults) seen during a generation."""

    generation: int
    lines: list[str]


class PluginsLoaded(Event, name="plugins_loaded"):
    """The classifier plugins and rule files in use."""

    plugins: list[str]
    disabled: list[str] | None
    failed: list[str] | None
    rule_files: list[str] | None


class PluginFailed(Event, name="plugin_failed", level=ERROR):
    """A classifier plugin failed to load or raised: it is skipped."""

    plugin: str
    stage: str
    error: str


class ErrorLogsWritten(Event, name="error_logs_written"):
    """The failed ranks' error logs were copied where the job asked."""

    files: list[str]


class ErrorLogsUnwritable(Event, name="error_logs_unwritable", level=WARNING):
    """The failed ranks' error logs could not be written."""

    prefix: str
    error: str


class HangBundle(Event, name="hang_bundle"):
    """A hang's diagnostic bundle (stacks, native stacks, NCCL flight recorder) was written."""

    generation: int
    path: str
    ranks: int
    native: int
    native_error: str | None
    flight_recorder: int
    flight_recorder_behind: dict[str, list[int]] | None
    seconds: float


class HangBundleUnwritable(Event, name="hang_bundle_unwritable", level=WARNING):
    """A hang's diagnostic bundle could not be written."""

    generation: int
    path: str
    error: str
