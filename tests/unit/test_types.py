import signal

from supervisor.core.types import ExitStatus, signal_name


def test_negative_returncode_is_a_signal() -> None:
    status = ExitStatus.from_returncode(-signal.SIGKILL)
    assert status == ExitStatus(signal=9)
    assert not status.succeeded
    assert status.describe() == "signal 9 (SIGKILL)"


def test_exit_codes() -> None:
    assert ExitStatus.from_returncode(0).succeeded
    assert ExitStatus.from_returncode(3).describe() == "exit code 3"
    assert not ExitStatus.from_returncode(3).succeeded


def test_unknown_signal_number_still_has_a_name() -> None:
    assert signal_name(200) == "SIG200"
