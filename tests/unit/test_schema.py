import orjson
import pytest

from supervisor.transport import schema
from supervisor.transport.schema import Dropped, DropReason


def _msg(**fields: object) -> bytes:
    return orjson.dumps({"v": 1, "rank": 1, "gen": 2, **fields})


def test_every_rank_message_round_trips() -> None:
    cases = [
        (schema.encode("hello", rank=1, gen=2, pid=9, stack_signal=38), schema.Hello(1, 2, 9, 38)),
        (schema.encode("heartbeat", rank=1, gen=2), schema.Heartbeat(1, 2)),
        (
            schema.encode("section", rank=1, gen=2, op="open", name="step", iteration=7),
            schema.Section(1, 2, schema.SectionOp.OPEN, "step", 7),
        ),
        (
            schema.encode("section", rank=1, gen=2, op="close_all", name=None, iteration=None),
            schema.Section(1, 2, schema.SectionOp.CLOSE_ALL, None, None),
        ),
        (schema.encode("iteration", rank=1, gen=2, iteration=3), schema.Iteration(1, 2, 3)),
        (schema.encode("checkpoint", rank=1, gen=2, event="saved"), schema.Checkpoint(1, 2, "saved")),
        (
            schema.encode("timeouts", rank=1, gen=2, timeouts={"heartbeat": 3}),
            schema.LoadTimeouts(1, 2, {"heartbeat": 3}),
        ),
        (
            schema.encode("request", rank=1, gen=2, action="abort", reason="bad data", id="r1"),
            schema.WorkloadRequest(1, 2, schema.RequestAction.ABORT, "bad data", "r1"),
        ),
        (
            schema.encode("section", rank=1, gen=2, op="close", name="step", iteration=7, failed=True),
            schema.Section(1, 2, schema.SectionOp.CLOSE, "step", 7, failed=True),
        ),
        (
            schema.encode("calculate", rank=1, gen=2, id="c1", heartbeat=True, sections=["step"],
                          sections_too=True, out_of_section=False),
            schema.Calculate(1, 2, "c1", True, ("step",), True, False),
        ),
        (
            schema.encode("exception", rank=1, gen=2, exc_type="E", message="m", traceback="", causes=[],
                          pid=77),
            schema.ExceptionReport(1, 2, "E", "m", "", (), 77),
        ),
        (schema.encode("checkpoint_interval", rank=1, gen=2, id="a1"), schema.AdviceQuery(1, 2, "a1")),
        (schema.encode("bye", rank=1, gen=2), schema.Bye(1, 2)),
        (schema.encode("saver", rank=1, gen=2, pid=9, id="s1"), schema.SaverReady(1, 2, 9, "s1")),
        (
            schema.encode("saved", rank=1, gen=2, id="q", ok=False, error="disk full", seconds=1),
            schema.Saved(1, 2, "q", False, "disk full", 1.0),
        ),
        (
            schema.encode("snapshot_begin", rank=1, gen=2, id="b1", slot=1, bytes=4096),
            schema.SnapshotBegin(1, 2, "b1", 1, 4096),
        ),
        (
            schema.encode("snapshot_done", rank=1, gen=2, slot=0, step=7, bytes=100,
                          checksum="00AB34cd5e6f7890"),
            schema.SnapshotDone(1, 2, 0, 7, 100, "00ab34cd5e6f7890"),
        ),
        (schema.encode("snapshot_restore", rank=1, gen=2, id="r1"), schema.SnapshotRestore(1, 2, "r1")),
        (schema.encode("resumed", rank=1, gen=2, source="memory", step=9, why="newer"),
         schema.Resumed(1, 2, "memory", 9, "newer")),
        (schema.encode("resumed", rank=1, gen=2, source="none", step=None),
         schema.Resumed(1, 2, "none", None, "")),
    ]
    for payload, expected in cases:
        assert schema.decode_rank_message(payload) == expected


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\x00\xff garbage", DropReason.MALFORMED),
        (b"[1, 2]", DropReason.MALFORMED),
        (orjson.dumps({"v": 2, "type": "heartbeat", "rank": 0, "gen": 0}), DropReason.UNKNOWN_VERSION),
        (orjson.dumps({"type": "heartbeat", "rank": 0, "gen": 0}), DropReason.UNKNOWN_VERSION),
        (_msg(type="teleport"), DropReason.UNKNOWN_TYPE),
        (_msg(type=None), DropReason.UNKNOWN_TYPE),
        (orjson.dumps({"v": 1, "type": "heartbeat", "rank": "0", "gen": 0}), DropReason.MALFORMED),
        (orjson.dumps({"v": 1, "type": "heartbeat", "rank": True, "gen": 0}), DropReason.MALFORMED),
        (_msg(type="section", op="open"), DropReason.MALFORMED),
        (_msg(type="section", op="sideways", name="x"), DropReason.MALFORMED),
        (_msg(type="section", op="open", name="x" * 1000), DropReason.MALFORMED),
        (_msg(type="request", action="explode"), DropReason.MALFORMED),
        (_msg(type="checkpoint", event="lost"), DropReason.MALFORMED),
        (_msg(type="timeouts", timeouts=[1]), DropReason.MALFORMED),
        (_msg(type="hello"), DropReason.MALFORMED),
        (_msg(type="section", op="close", name="x", failed="yes"), DropReason.MALFORMED),
        (_msg(type="calculate", id="c", sections=["s"] * 65), DropReason.MALFORMED),
        (_msg(type="calculate", id="c", sections="step"), DropReason.MALFORMED),
        (_msg(type="calculate", id="c", heartbeat=1), DropReason.MALFORMED),
        (_msg(type="calculate", heartbeat=True), DropReason.MALFORMED),
        (_msg(type="saver"), DropReason.MALFORMED),
        (_msg(type="saved", id="q", ok="yes", seconds=1), DropReason.MALFORMED),
        (_msg(type="saved", id="q", ok=True, seconds=-1), DropReason.MALFORMED),
        (_msg(type="saved", id="q", ok=True, seconds=True), DropReason.MALFORMED),
        (_msg(type="saved", ok=True, seconds=1), DropReason.MALFORMED),
        (_msg(type="snapshot_begin", id="b", slot=2, bytes=10), DropReason.MALFORMED),
        (_msg(type="snapshot_begin", id="b", slot=0, bytes=0), DropReason.MALFORMED),
        (_msg(type="snapshot_begin", id="b", slot=0, bytes=schema.MAX_SNAPSHOT_BYTES + 1),
         DropReason.MALFORMED),
        (_msg(type="snapshot_begin", id="b", slot=True, bytes=10), DropReason.MALFORMED),
        (_msg(type="snapshot_begin", slot=0, bytes=10), DropReason.MALFORMED),
        (_msg(type="snapshot_done", slot=0, step=-1, bytes=10, checksum="ab"), DropReason.MALFORMED),
        (_msg(type="snapshot_done", slot=0, step=1, bytes=10, checksum="xyz"), DropReason.MALFORMED),
        (_msg(type="snapshot_done", slot=0, step=1, bytes=10, checksum="a" * 17), DropReason.MALFORMED),
        (_msg(type="snapshot_done", slot=0, step=1, bytes=10, checksum=""), DropReason.MALFORMED),
        (_msg(type="snapshot_done", slot=0, step=1.5, bytes=10, checksum="ab"), DropReason.MALFORMED),
        (_msg(type="resumed", source="tape", step=1, why="x"), DropReason.MALFORMED),
        (_msg(type="resumed", source="disk", step=-1, why="x"), DropReason.MALFORMED),
        (_msg(type="resumed", source="disk", step=1, why="x" * 401), DropReason.MALFORMED),
        (_msg(type="snapshot_restore", id="r" * 65), DropReason.MALFORMED),
        (b"{" + b" " * schema.MAX_MESSAGE + b"}", DropReason.OVERSIZED),
    ],
)
def test_bad_messages_are_dropped_with_a_reason(payload: bytes, reason: DropReason) -> None:
    with pytest.raises(Dropped) as caught:
        schema.decode_rank_message(payload)
    assert caught.value.reason is reason


def test_control_requests_and_replies() -> None:
    assert schema.decode_control(
        orjson.dumps({"v": 1, "type": "status", "id": "a"})
    ) == schema.ControlRequest("status", "a")
    with pytest.raises(Dropped):
        schema.decode_control(orjson.dumps({"v": 1, "type": "format_disk"}))
    reply = orjson.loads(schema.reply("a", ok=False, error="nope"))
    assert reply == {"v": 1, "id": "a", "ok": False, "data": None, "error": "nope"}
