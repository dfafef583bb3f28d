"""The in-rank client against a real ROUTER socket standing in for the daemon."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest
import zmq

from supervisor.core.topology import ENV_RANKS_ENDPOINT, ENV_TIMEOUTS
from supervisor.transport import schema


def _run(code: str, env: dict[str, str], tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def router(tmp_path: Path):  # type: ignore[no-untyped-def]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path / 'ranks.sock'}"
    sock.bind(endpoint)
    yield sock, endpoint
    sock.close()
    ctx.term()


def _drain(sock: zmq.Socket, expected: int) -> dict[bytes, list[dict[str, object]]]:
    """Messages by sender: ZeroMQ orders each connection's messages, not all of them."""
    by_sender: dict[bytes, list[dict[str, object]]] = {}
    for _ in range(expected):
        if not sock.poll(10_000):
            break
        identity, payload = sock.recv_multipart()
        by_sender.setdefault(identity, []).append(orjson.loads(payload))
    return by_sender


def test_messages_the_daemon_gets(router, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sock, endpoint = router
    env = dict(os.environ, RANK="3", TORCHELASTIC_RESTART_COUNT="2")
    env[ENV_RANKS_ENDPOINT] = endpoint
    env[ENV_TIMEOUTS] = orjson.dumps({"sections": {"step": 5}, "learned": {"heartbeat": 2.0}}).decode()
    r = _run(
        """
        import os
        from supervisor import client
        client.heartbeat()                    # initialises on first use
        with client.section("step"):
            pass
        with client.section("unmonitored"):   # costs nothing, sends nothing
            pass
        client.report_iteration(7)
        print(client.request("abort", "data is corrupt", timeout=0.2))  # nobody acks here
        client.report_checkpoint("saved")
        client.load_state_dict(client.state_dict())
        pid = os.fork()
        if pid == 0:
            client.heartbeat()                # a fresh socket in the child
            from supervisor.client import _held
            _held.client.channel.close(linger_ms=5000)  # deliver it before _exit
            os._exit(0)
        os.waitpid(pid, 0)
        client.shutdown()
        """,
        env,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "False\n"
    senders = _drain(sock, 10)
    assert sorted(len(v) for v in senders.values()) == [1, 9]
    child = next(v for v in senders.values() if len(v) == 1)
    got = next(v for v in senders.values() if len(v) == 9)
    assert child[0]["type"] == "heartbeat" and child[0]["rank"] == 3
    kinds = [(m["type"], m.get("op"), m.get("name")) for m in got]
    assert kinds == [
        ("hello", None, None),
        ("heartbeat", None, None),
        ("section", "open", "step"),
        ("section", "close", "step"),
        ("iteration", None, None),
        ("request", None, None),
        ("checkpoint", None, None),
        ("timeouts", None, None),
        ("bye", None, None),
    ]
    assert all(m["v"] == 1 and m["rank"] == 3 and m["gen"] == 2 for m in got)
    assert got[0]["stack_signal"] is not None
    assert got[4]["iteration"] == 7
    assert (got[5]["action"], got[5]["reason"]) == ("abort", "data is corrupt")
    assert got[7]["timeouts"] == {"heartbeat": 2.0}


def test_without_a_daemon_every_call_is_a_no_op_after_one_warning(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != ENV_RANKS_ENDPOINT}
    r = _run(
        """
        from supervisor import client
        for i in range(3):
            client.heartbeat()
            with client.section("step"):
                client.report_iteration(i)
        print(client.is_active(), client.state_dict())
        """,
        env,
        tmp_path,
    )
    assert r.returncode == 0
    assert r.stdout == "False {'ft_supervisor_timeouts': {}}\n"
    assert r.stderr.count("no ft-supervisor daemon supervises this process") == 1


def test_a_daemon_that_never_reads_never_blocks_training(tmp_path: Path) -> None:
    env = dict(os.environ, RANK="0")
    env[ENV_RANKS_ENDPOINT] = f"ipc://{tmp_path / 'nobody-listens.sock'}"
    r = _run(
        """
        from supervisor import client
        for _ in range(50_000):
            client.heartbeat()
        from supervisor.client import _held
        print(_held.client.channel.dropped)
        """,
        env,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) > 0  # beyond the high-water mark, dropped instead of waited for


def test_a_request_is_acknowledged_and_calls_after_shutdown_stay_silent(router, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sock, endpoint = router
    env = dict(os.environ, RANK="0")
    env[ENV_RANKS_ENDPOINT] = endpoint
    rank = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            from supervisor import client
            print(client.request("reschedule", "bad node", timeout=30), flush=True)
            client.shutdown()
            client.heartbeat()          # no-ops now: no reconnect, no second hello
            client.start_section("step")
            print(client.is_active(), flush=True)
        """)],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        seen = []
        while sock.poll(10_000):
            identity, payload = sock.recv_multipart()
            m = orjson.loads(payload)
            seen.append(m["type"])
            if m["type"] == "request":
                sock.send_multipart([identity, orjson.dumps({"v": 1, "type": "ack", "id": m["id"]})])
            if m["type"] == "bye":
                break
        out, _ = rank.communicate(timeout=30)
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait()
    assert out == "True\nFalse\n"
    assert seen == ["hello", "request", "bye"]
    assert not sock.poll(200)  # nothing after the bye


def test_an_uncaught_exception_is_reported_with_its_causes(router, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sock, endpoint = router
    env = dict(os.environ, RANK="1", TORCHELASTIC_RESTART_COUNT="0")
    env[ENV_RANKS_ENDPOINT] = endpoint
    r = _run(
        """
        from supervisor import client
        client.init()
        class BackendError(RuntimeError):
            pass
        try:
            raise ConnectionResetError("the peer went away")
        except ConnectionResetError as cause:
            raise BackendError("NCCL communicator was aborted") from cause
        """,
        env,
        tmp_path,
    )
    assert r.returncode == 1
    assert "BackendError: NCCL communicator was aborted" in r.stderr  # the usual traceback still prints
    (messages,) = _drain(sock, 2).values()
    assert [m["type"] for m in messages] == ["hello", "exception"]
    report = schema.decode_rank_message(orjson.dumps(messages[1]))
    assert isinstance(report, schema.ExceptionReport)
    assert (report.rank, report.exc_type) == (1, "BackendError")
    assert report.message == "NCCL communicator was aborted"
    assert report.causes == (("ConnectionResetError", "the peer went away"),)
    assert "Traceback (most recent call last)" in report.traceback
    assert report.pid is not None and report.pid != os.getpid()  # the rank's own: not a child's


def test_a_late_stack_dump_request_cannot_kill_an_exiting_rank(router, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # as the interpreter finalizes, faulthandler puts back the handler it found; were that
    # the default one, the daemon's dump signal (a real-time signal) would kill the rank
    # and its own exit status would be lost from the evidence
    _, endpoint = router
    env = dict(os.environ, RANK="0", TORCHELASTIC_RESTART_COUNT="0")
    env[ENV_RANKS_ENDPOINT] = endpoint
    r = _run(
        """
        import faulthandler, os, sys
        from supervisor import client
        client.init()
        faulthandler.unregister(client.STACK_SIGNAL)  # what finalization does
        os.kill(os.getpid(), client.STACK_SIGNAL)
        sys.exit(7)
        """,
        env,
        tmp_path,
    )
    assert r.returncode == 7, r.stderr
