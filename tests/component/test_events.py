import json
import logging
from pathlib import Path

from supervisor.clock import Clock
from supervisor.runtime.records.events import EventLog


def test_each_event_is_one_json_line_with_both_clocks(tmp_path: Path, caplog: object) -> None:
    logger = logging.getLogger("supervisor.test-events")
    log = EventLog(tmp_path / "events.jsonl", logger, Clock(), run_id="r1")
    log.emit("rank_exited", rank=1, exit_code=None, signal="SIGKILL")
    log.emit("status", ranks=[{"rank": 0}])
    log.close()
    first, second = (json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines())
    assert first["event"] == "rank_exited"
    assert first["run_id"] == "r1" and first["rank"] == 1 and first["signal"] == "SIGKILL"
    assert first["t_wall"] > 1e9 and first["t_mono"] > 0
    assert second["ranks"] == [{"rank": 0}]
    assert second["t_mono"] >= first["t_mono"]
