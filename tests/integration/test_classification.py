"""A third-party plugin found through its entry point, as pip installs it, changes a
decision of a real daemon over real ranks. Every other classification and decision
case runs in-process on virtual time: tests/fast/test_classification.py."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from tests.support import RANKS, Daemon

FAILS = str(RANKS / "fails.py")
FAST = ("--nproc-per-node", "2", "--preload", "none")
Start = Callable[..., Daemon]


def _decisions(d: Daemon) -> list[tuple[str, str | None]]:
    return [(e["action"], e.get("rule")) for e in d.events("decision")]


def test_a_third_party_plugin_changes_decisions(start: Start, tmp_path: Path) -> None:
    # a plugin package, installed as pip would: a module and its dist-info with an entry point;
    # without it (and with it disabled by name) the built-ins abort on P3: tests/fast
    site = tmp_path / "site"
    (site / "ft_test_plugin-1.0.dist-info").mkdir(parents=True)
    (site / "ft_test_plugin-1.0.dist-info" / "METADATA").write_text("Name: ft-test-plugin\nVersion: 1.0\n")
    (site / "ft_test_plugin-1.0.dist-info" / "entry_points.txt").write_text(
        "[ft_supervisor.plugins]\nsite_policy = ft_test_plugin\nbroken = ft_test_plugin_missing\n"
    )
    (site / "ft_test_plugin.py").write_text(
        "from supervisor.hooks import hookimpl\n"
        "from supervisor.core.classify import Classification\n"
        "from supervisor.core.types import Action\n"
        "@hookimpl\n"
        "def classify_failure(evidence):\n"
        "    for f in evidence.failures:\n"
        "        if any('quota exceeded on /scratch' in ln for ln in f.texts()):\n"
        "            return Classification('SITE-QUOTA', 'storage', 'hardware', Action.RESCHEDULE,\n"
        "                                  rank=f.exit.rank, summary='scratch quota: move')\n"
        "    return None\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    say = ("--say", "OSError: Disk quota exceeded: quota exceeded on /scratch")
    d = start(*FAST, FAILS, *say, "--exit", "1", env=env)
    assert d.wait() == 200, d.stderr()
    assert _decisions(d) == [("reschedule", "SITE-QUOTA")]
    assert d.events("decision")[0]["classifier"] == "site_policy"
    loaded = d.events("plugins_loaded")[0]
    assert loaded["plugins"] == ["rules", "site_policy"] and loaded["failed"] == ["broken"]
    failed = d.events("plugin_failed")[0]
    assert failed["plugin"] == "broken" and "ft_test_plugin_missing" in failed["error"]
