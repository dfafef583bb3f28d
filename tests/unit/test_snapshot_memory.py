"""``--snapshot-memory``: bytes or a fraction of the node's memory, checked."""

from __future__ import annotations

import pytest

from supervisor.cli import build_parser
from supervisor.config import memory
from supervisor.config.build import build_run_config
from supervisor.config.errors import ConfigError

GIB = 1 << 30


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.25", GIB),
        (".5", 2 * GIB),
        ("1.0", 4 * GIB),
        ("0", 0),
        ("4096", 4096),
        ("512M", 512 << 20),
        ("2g", 2 * GIB),
        ("64KiB", 64 << 10),
        ("1 TB", 1 << 40),
    ],
)
def test_sizes_and_fractions(text: str, expected: int) -> None:
    assert memory.parse(text, 4 * GIB) == expected


@pytest.mark.parametrize("text", ["", "-1", "1.5", "2X", "half", "1e9", "9" * 40, "0.2.5"])
def test_what_is_not_a_size_is_refused_with_the_option(text: str) -> None:
    with pytest.raises(ConfigError, match="--snapshot-memory"):
        memory.parse(text, 4 * GIB)


def test_the_run_config_holds_bytes_a_quarter_of_memory_by_default() -> None:
    def config(*options: str) -> int | None:
        ns = build_parser().parse_args(["run", "--nproc-per-node", "1", "--no-python", *options, "true"])
        return build_run_config(ns, {}).snapshot_memory

    assert config() == int(0.25 * memory.mem_total())
    assert config("--snapshot-memory", "1G") == GIB
