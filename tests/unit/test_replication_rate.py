"""``--snapshot-replication-rate``: bytes a second with the same suffixes as
--snapshot-memory (powers of 1024), 0 for no replication, 256M by default."""

from __future__ import annotations

import pytest

from supervisor.cli import build_parser
from supervisor.config import memory
from supervisor.config.build import build_run_config
from supervisor.config.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"), [("256M", 256 << 20), ("1g", 1 << 30), ("0", 0), ("64KiB", 64 << 10)]
)
def test_a_rate_is_bytes_a_second(text: str, expected: int) -> None:
    assert memory.parse_rate(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "0.5", "fast", "9" * 40])
def test_what_is_not_a_rate_is_refused_with_the_option(text: str) -> None:
    with pytest.raises(ConfigError, match="--snapshot-replication-rate"):
        memory.parse_rate(text)


def test_the_run_config_holds_the_rate_256m_by_default() -> None:
    def config(*options: str) -> int:
        ns = build_parser().parse_args(["run", "--nproc-per-node", "1", "--no-python", *options, "true"])
        return build_run_config(ns, {}).snapshot_replication_rate

    assert config() == 256 << 20
    assert config("--snapshot-replication-rate", "0") == 0
