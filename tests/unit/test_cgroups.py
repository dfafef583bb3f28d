"""Finding the daemon's cgroup v2 directory from /proc/self/cgroup and mountinfo."""

from __future__ import annotations

from pathlib import Path

from supervisor.cli.control import render_status
from supervisor.process.cgroups import Containment, cgroup2_mounts, own_cgroup, resolve

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
UNIFIED = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
# a Kubernetes pod: the container's cgroup namespace, mounted read-only
POD = "1250 1240 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw\n"
# a bind mount of part of the tree, with a space in its mount point
PART = "50 23 0:26 /system.slice /mnt/my\\040cgroups rw,relatime - cgroup2 cgroup2 rw\n"


def test_own_cgroup_is_the_v2_line() -> None:
    text = "9:name=systemd:/\n4:memory:/process_api/80cc\n0::/system.slice/ft.service\n"
    assert own_cgroup(text) == "/system.slice/ft.service"
    assert own_cgroup("4:memory:/x\n1:cpu:/\n") is None  # cgroup v1 only


def test_mounts_are_the_cgroup2_ones_with_their_writability() -> None:
    assert cgroup2_mounts(HYBRID) == [("/", "/sys/fs/cgroup/unified", True)]
    assert cgroup2_mounts(UNIFIED) == [("/", "/sys/fs/cgroup", True)]
    assert cgroup2_mounts(POD) == [("/", "/sys/fs/cgroup", False)]
    assert cgroup2_mounts(PART) == [("/system.slice", "/mnt/my cgroups", True)]


def test_resolve_puts_the_cgroup_under_the_mount_that_shows_it() -> None:
    assert resolve("/", cgroup2_mounts(HYBRID)) == Path("/sys/fs/cgroup/unified")
    unified = cgroup2_mounts(UNIFIED)
    assert resolve("/system.slice/ft.service", unified) == Path("/sys/fs/cgroup/system.slice/ft.service")
    part = cgroup2_mounts(PART)
    assert resolve("/system.slice/ft.service", part) == Path("/mnt/my cgroups/ft.service")


def test_resolve_says_why_there_is_no_usable_directory() -> None:
    assert "read-only" in str(resolve("/", cgroup2_mounts(POD)))
    assert "cgroup v1 only" in str(resolve("/", []))
    assert "outside its cgroup namespace" in str(resolve("/../../other", cgroup2_mounts(UNIFIED)))
    assert "no cgroup2 mount shows" in str(resolve("/user.slice/x", cgroup2_mounts(PART)))


def test_containment_describes_itself_for_events_and_status() -> None:
    run = Containment(Path("/sys/fs/cgroup/x"), "cgroup.kill")
    assert run.describe() == {"mode": "cgroup", "cgroup": "/sys/fs/cgroup/x", "kill": "cgroup.kill"}
    fallback = Containment(why="no cgroup2 hierarchy is mounted (cgroup v1 only)")
    assert fallback.describe() == {"mode": "fallback", "why": fallback.why}
    assert fallback.generation(3) is fallback  # nothing to create


def test_status_text_says_which_containment_is_in_force() -> None:
    status = {"run_id": "r", "pid": 1, "generation": 0, "restarts_used": 0, "max_restarts": 3,
              "uptime_s": 1.0, "ranks": [], "run_dir": "/tmp/r"}  # fmt: skip
    cgroup = Containment(Path("/sys/fs/cgroup/ft/gen-0"), "cgroup.kill").describe()
    text = render_status({**status, "containment": cgroup})
    assert "containment: cgroup /sys/fs/cgroup/ft/gen-0 (ended with cgroup.kill)" in text
    fallback = Containment(why="the cgroup2 hierarchy at /sys/fs/cgroup is mounted read-only").describe()
    text = render_status({**status, "containment": fallback})
    assert "containment: fallback: process groups, PDEATHSIG, token sweep (the cgroup2 hierarchy" in text
    assert "containment" not in render_status(status)  # an older daemon's status
