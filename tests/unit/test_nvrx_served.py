"""NVRx's client served by ours in a rank (supervisor.process.bootstrap's finder), here
in this process: which names are ours, which stay NVRx's own, and the message that
tells the daemon which NVRx version it serves."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from importlib.metadata import version

import pytest

from supervisor.client import nvrx
from supervisor.process import bootstrap
from supervisor.transport import schema

pytest.importorskip("nvidia_resiliency_ext")

NVRX = "nvidia_resiliency_ext"


@pytest.fixture
def fresh_nvrx(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """NVRx's modules imported anew, the finder first on the meta path; all as it was after."""
    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if name.split(".")[0] == NVRX}
    monkeypatch.setattr(sys, "meta_path", [bootstrap._NvrxFinder, *sys.meta_path])
    for attr in ("as_nvrx", "version", "told"):
        monkeypatch.setattr(nvrx._Served, attr, getattr(nvrx._Served, attr))
    yield
    for name in [name for name in sys.modules if name.split(".")[0] == NVRX]:
        del sys.modules[name]
    sys.modules.update(saved)


@pytest.mark.usefixtures("fresh_nvrx")
def test_nvrx_client_names_are_ours_and_the_rest_stays_nvrx() -> None:
    ft = importlib.import_module("nvidia_resiliency_ext.fault_tolerance")
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient  # noqa: PLC0415
    from nvidia_resiliency_ext.fault_tolerance.rank_monitor_client import (  # noqa: PLC0415
        RankMonitorClientError,
    )

    assert RankMonitorClient is nvrx.RankMonitorClient
    assert RankMonitorClientError is nvrx.RankMonitorClientError
    assert ft.WorkloadAction is nvrx.WorkloadAction
    assert ft.WorkloadControlRequest is nvrx.WorkloadControlRequest
    # NVRx's own submodules, found in its own directory, and its config under the package's name
    config = importlib.import_module("nvidia_resiliency_ext.fault_tolerance.config")
    assert config.__file__ is not None and "nvidia_resiliency_ext" in config.__file__
    assert ft.FaultToleranceConfig is config.FaultToleranceConfig
    with pytest.raises(AttributeError):
        _ = ft.NoSuchName
    # served: the daemon will hear the version at init_workload_monitoring
    assert (nvrx._Served.as_nvrx, nvrx._Served.version) == (True, version("nvidia-resiliency-ext"))


def test_without_our_client_nvrx_keeps_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # an interpreter where ft-supervisor's client cannot be imported: the finder steps
    # aside, NVRx's own client loads (and fails as it would: rule P0-NVRX)
    monkeypatch.setattr(bootstrap, "_NVRX_SERVED", "supervisor.client._no_such_module")
    assert bootstrap._NvrxFinder.find_spec("nvidia_resiliency_ext.fault_tolerance", ["/x"]) is None
    # and it never answers for anything else of NVRx
    monkeypatch.undo()
    for name in ("nvidia_resiliency_ext.checkpointing", "nvidia_resiliency_ext.fault_tolerance.config",
                 "nvidia_resiliency_ext.ptl_resiliency", "nvidia_resiliency_ext"):  # fmt: skip
        assert bootstrap._NvrxFinder.find_spec(name, ["/x"]) is None


def test_the_served_message_carries_a_bounded_version() -> None:
    message = schema.decode_rank_message(schema.encode("nvrx", rank=1, gen=0, version="0.4.1"))
    assert message == schema.NvrxServed(1, 0, "0.4.1")
    unknown = schema.decode_rank_message(schema.encode("nvrx", rank=1, gen=0, version=None))
    assert unknown == schema.NvrxServed(1, 0, None)
    with pytest.raises(schema.Dropped, match="version"):
        schema.decode_rank_message(schema.encode("nvrx", rank=1, gen=0, version="x" * 65))


def test_client_config_is_none_before_init_as_in_nvrx() -> None:
    assert nvrx.RankMonitorClient().cfg is None
