"""When standbys start: the rule, on the CPUs a node has and the load it carries."""

from __future__ import annotations

import os

from supervisor.core.standby_start import AFTER_STEPS, WITH_GENERATION, CpuRoom, idle_cores, standby_start
from supervisor.runtime.lifecycle.processes import cpu_room


def test_a_rank_group_of_one_on_two_idle_cores_starts_its_standby_with_the_generation() -> None:
    start = standby_start(CpuRoom(cpus=2, online=2, load=0.0), ranks=1)
    assert (start.when, start.idle_cores) == (WITH_GENERATION, 2.0)
    assert "cover 1 starting rank(s)" in start.why


def test_two_ranks_on_two_cores_wait_for_their_steps() -> None:
    start = standby_start(CpuRoom(cpus=2, online=2, load=0.0), ranks=2)
    assert start.when == AFTER_STEPS and "4 wanted" in start.why


def test_a_gpu_node_with_idle_cores_starts_them_with_the_generation_and_a_busy_one_waits() -> None:
    assert standby_start(CpuRoom(cpus=96, online=96, load=1.5), ranks=8).when == WITH_GENERATION
    # busy with another job (or the daemon's own fork server still importing): the load counts
    assert standby_start(CpuRoom(cpus=2, online=2, load=1.0), ranks=1).when == AFTER_STEPS
    assert standby_start(CpuRoom(cpus=16, online=16, load=14.0), ranks=2).when == AFTER_STEPS


def test_a_process_bound_to_some_cpus_bears_its_share_of_the_nodes_load() -> None:
    # 8 of 96 CPUs, the node half busy: about 4 of ours are idle
    assert idle_cores(CpuRoom(cpus=8, online=96, load=48.0)) == 4.0
    assert idle_cores(CpuRoom(cpus=4, online=4, load=40.0)) == 0.0  # never below none
    assert standby_start(CpuRoom(cpus=8, online=8, load=0.0), ranks=0).when == AFTER_STEPS


def test_the_room_read_from_this_machine_is_its_affinity_and_a_load() -> None:
    room = cpu_room()
    assert room.cpus == len(os.sched_getaffinity(0)) and room.online >= room.cpus and room.load >= 0.0
