import json
import logging
from pathlib import Path

from supervisor.clock import Clock
from supervisor.core.catalogue.daemon import SettingsIgnored
from supervisor.core.catalogue.ranks import RankExited
from supervisor.runtime.records.events import EventLog


def test_each_event_is_one_json_line_with_both_clocks(tmp_path: Path, caplog: object) -> None:
    logger = logging.getLogger("supervisor.test-events")
    log = EventLog(tmp_path / "events.jsonl", logger, Clock(), run_id="r1")
    log.emit(RankExited(generation=0, rank=1, local_rank=1, pid=40, exit_code=None, signal="SIGKILL",
                        state="failed", standby=None, stdout_bytes=None, stderr_bytes=0))  # fmt: skip
    log.emit(SettingsIgnored(settings=[{"option": "--no-python", "why": "always python"}]))
    log.close()
    first, second = (json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines())
    assert first["event"] == "rank_exited"
    assert first["run_id"] == "r1" and first["rank"] == 1 and first["signal"] == "SIGKILL"
    assert first["t_wall"] > 1e9 and first["t_mono"] > 0
    assert second["settings"] == [{"option": "--no-python", "why": "always python"}]
    assert second["t_mono"] >= first["t_mono"]
