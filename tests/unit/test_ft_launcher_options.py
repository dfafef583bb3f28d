"""Every option of nvidia-resiliency-ext's ft_launcher is accepted by ``run``, in
every spelling it has had, and is either honoured or reported as ignored with why.

The installed launcher's own parser is walked: the day NVRx adds an option we do
not know, this fails. Its torchrun options are torch's (the torchrun walk covers
them); the rest are ft_launcher's, checked here by building a RunConfig.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

from supervisor.cli import build_parser
from supervisor.config import ft as ftconfig
from supervisor.config.build import build_run_config
from supervisor.config.errors import ConfigError
from supervisor.config.run import RunConfig

# ft_launcher's options that do something here: the value given, and what it does
HONOURED: dict[str, tuple[str, Callable[[RunConfig], object], object]] = {
    "ft_cfg_path": ("", lambda c: c.hosting.config_file, None),  # the file is given below
    "ft_initial_rank_heartbeat_timeout": ("5m", lambda c: c.ft.initial_rank_heartbeat_timeout, 300.0),
    "ft_rank_heartbeat_timeout": ("90", lambda c: c.ft.rank_heartbeat_timeout, 90.0),
    "ft_rank_out_of_section_timeout": ("1h", lambda c: c.ft.rank_out_of_section_timeout, 3600.0),
    "ft_rank_section_timeouts": ("step:5m,setup:none", lambda c: dict(c.ft.rank_section_timeouts),
                                 {"step": 300.0, "setup": None}),
    "ft_safety_factor": ("3", lambda c: c.ft.safety_factor, 3.0),
    "ft_rank_termination_signal": ("SIGTERM", lambda c: c.ft.rank_termination_signal, signal.SIGTERM),
    "ft_max_no_progress_cycles": ("7", lambda c: c.policy.policy.max_no_progress, 7),
    "ft_min_progress_iterations": ("4", lambda c: c.policy.policy.min_progress, 4),
    "ft_no_restart_exit_code": ("17", lambda c: c.policy.exit_codes.abort, 17),
    "ft_restart_policy": ("any-failed", lambda c: c.ft.ignored, ()),  # what happens here anyway
    "ft_ignore_missing_cfg": ("", lambda c: c.ft.ignored, ()),  # no config is never an error here
    "term_timeout": ("10m", lambda c: c.term_timeout, 600.0),
    "workers_stop_timeout": ("45s", lambda c: c.shutdown_timeout, 45.0),
}  # fmt: skip

# the launcher's options in nvidia-resiliency-ext's current sources (0.5-0.7, main), as
# ft_launcher spells them, beyond the installed 0.4.1's; and ones it had and dropped
CURRENT = [
    "--ft-cfg_path", "--ft-node-health-check-endpoint", "--ft-node_health_check_endpoint",
    "--ft-enable-nic-healthcheck", "--ft-enable_nic_healthcheck", "--ft-link-state-path-template",
    "--ft-link_state_path_template", "--ft-enable-dist-storage-healthcheck",
    "--ft_enable_dist_storage_healthcheck", "--ft-storage-health-check-path",
    "--ft_storage_health_check_path", "--ft-skip-section-response", "--ft-skip_section_response",
    "--ft-rdzv-impl", "--ft-rdzv_impl", "--ft-numa-bind-strict", "--ft-numa_bind_strict",
    "--ft-gpu-memory-reclaim-timeout", "--ft-gpu_memory_reclaim_timeout", "--ft-gpu-memory-tolerance-mb",
    "--ft-gpu_memory_tolerance_mb", "--ft-gpu-memory-poll-interval", "--ft-gpu_memory_poll_interval",
    "--ft-check-remaining-processes", "--ft-check_remaining_processes", "--ft-install-exception-hook",
    "--ft-install_exception_hook", "--ft-attribution-endpoint", "--ft_attribution_endpoint",
    "--ft-attribution-startup-timeout", "--ft_attribution_startup_timeout",
    "--ft-attribution-llm-api-key-file", "--ft_attribution_llm_api_key_file",
    "--ft-attribution-llm-base-url", "--ft_attribution_llm_base_url", "--ft-attribution-llm-model",
    "--ft_attribution_llm_model", "--ft-attribution-analysis-backend", "--ft_attribution_analysis_backend",
    "--ft-attribution-stop-action", "--ft_attribution_stop_action", "--ft-attribution-log-level",
    "--ft_attribution_log_level", "--ft-attribution-export-url", "--ft_attribution_export_url",
    "--ft-attribution-compute-timeout", "--ft_attribution_compute_timeout", "--ft-no-restart-exit-code",
    "--ft_no_restart_exit_code", "--ft-cycle-info-dir", "--ft_cycle_info_dir", "--ft-cycle-info-job-id",
    "--ft_cycle_info_job_id", "--ft-max-no-progress-cycles", "--ft-max_no_progress_cycles",
    "--ft-min-progress-iterations", "--ft-min_progress_iterations", "--ft-checkpoint-iteration-file",
    "--ft-checkpoint_iteration_file", "--ft-segment", "--ft_segment", "--ft-per-cycle-applog-prefix",
    "--ft_per_cycle_applog_prefix", "--ft-nvrx-logfile", "--ft_nvrx_logfile", "--ft-enable-log-server",
    "--ft_enable_log_server", "--ft-log-server-port", "--ft_log_server_port", "--ft-log-aggregator-count",
    "--ft_log_aggregator_count", "--ft-log-leaf-max-queue-chunks", "--ft_log_leaf_max_queue_chunks",
    "--ft-log-server-log-prefix", "--ft_log_server_log_prefix", "--ft-log-server-graceful-shutdown-timeout",
    "--ft_log_server_graceful_shutdown_timeout", "--ft-use-infra-group-rank", "--ft-use_infra_group_rank",
]  # fmt: skip


@cache
def _nvrx_all() -> tuple[argparse.Action, ...]:
    from nvidia_resiliency_ext.fault_tolerance import launcher  # noqa: PLC0415

    return tuple(a for a in launcher.get_args_parser()._actions if a.option_strings and a.dest != "help")


@cache
def _nvrx() -> tuple[argparse.Action, ...]:
    """ft_launcher's own options: not torchrun's."""
    from torch.distributed.run import get_args_parser as torchrun  # noqa: PLC0415

    torch_options = {s for a in torchrun()._actions for s in a.option_strings}
    return tuple(a for a in _nvrx_all() if not set(a.option_strings) <= torch_options)


@cache
def _parser() -> argparse.ArgumentParser:
    return build_parser()


def _config(tmp: Path, *argv: str) -> RunConfig:
    script = tmp / "s.py"
    script.write_text("")
    return build_run_config(_parser().parse_args(["run", *argv, str(script)]), {})


def _value(action: argparse.Action) -> str:
    if action.dest in HONOURED:
        return HONOURED[action.dest][0]
    return str(action.choices[-1]) if action.choices else "1"  # type: ignore[index]


def _argv(option: str, action_dest: str, value: str, tmp: Path) -> list[str]:
    if action_dest == "ft_ignore_missing_cfg":
        return [option]
    if action_dest == "ft_cfg_path":
        f = tmp / "ft.yaml"
        f.write_text("fault_tolerance:\n  rank_heartbeat_timeout: 42\n")
        return [option, str(f)]
    return [option, value]


@pytest.mark.slow
@pytest.mark.torch  # the launcher imports torch
def test_the_installed_launcher_has_options_of_its_own() -> None:
    # the walk below is worth something only if it finds them
    dests = {a.dest for a in _nvrx()}
    assert {"ft_rank_heartbeat_timeout", "term_timeout", "ft_ignore_missing_cfg"} <= dests, dests


@pytest.mark.slow
@pytest.mark.torch  # the launcher imports torch
def test_every_option_of_the_installed_ft_launcher_is_honoured_or_ignored_with_why(tmp_path: Path) -> None:
    unknown = []
    for action in _nvrx():
        first, *others = action.option_strings
        argv = _argv(first, action.dest, _value(action), tmp_path)
        try:
            cfg = _config(tmp_path, *argv)
            # every other spelling is the same option
            unknown += [o for o in others if vars(_parser().parse_args(["run", o, *argv[1:], "s.py"])) !=
                        vars(_parser().parse_args(["run", *argv, "s.py"]))]  # fmt: skip
        except (SystemExit, ConfigError) as exc:
            unknown.append(f"{action.option_strings}: {exc}")
            continue
        if action.dest == "ft_cfg_path":
            assert cfg.hosting.config_file == tmp_path / "ft.yaml" and cfg.ft.rank_heartbeat_timeout == 42
        elif action.dest in HONOURED:
            _, what, expected = HONOURED[action.dest]
            assert what(cfg) == expected, first
        else:
            named = f"--{action.dest.replace('_', '-')}"
            assert [option for option, _ in cfg.ft.ignored] == [named], (first, cfg.ft.ignored)
            assert dict(cfg.ft.ignored)[named], first  # a reason, not a blank
    assert not unknown, "ft_launcher options ft-supervisor does not know:\n" + "\n".join(unknown)


@pytest.mark.slow
@pytest.mark.torch  # the launcher imports torch
def test_ft_launcher_s_torchrun_options_parse_in_every_spelling_it_gives_them() -> None:
    """Which of them are honoured is torchrun's walk's business; the spellings are checked here."""
    refused = []
    for action in _nvrx_all():
        value = [] if action.nargs == 0 else [str(action.default if action.default is not None else "x")]
        for option in action.option_strings:
            try:
                _parser().parse_args(["run", option, *value, "train.py"])
            except SystemExit:
                refused.append(option)
    assert not refused, refused


@pytest.mark.parametrize("option", CURRENT)
def test_the_current_launcher_s_spellings_are_accepted(option: str, tmp_path: Path) -> None:
    ns = _parser().parse_args(["run", option, "7", "train.py"])
    dest = next(d for d, v in vars(ns).items() if v == "7")
    if dest == "ft_cfg_path":
        return
    assert dest.startswith("ft_") and dest[3:] in ftconfig.SETTINGS
    assert (dest[3:] in ftconfig.KEYS) != (dest[3:] in ftconfig.IGNORED)


def test_a_flag_is_a_flag_and_not_the_script_s_name(tmp_path: Path) -> None:
    for flag in ("--ignore-missing-fault-tol-cfg", "--ft-ignore-missing-cfg", "--ft_ignore_missing_cfg"):
        ns = _parser().parse_args(["run", flag, "train.py", "--lr", "1"])
        assert ns.ft_ignore_missing_cfg is True and ns.training_script == "train.py", flag


@pytest.mark.parametrize(
    ("argv", "ignored", "why"),
    [
        (["--ft-restart-policy", "min-healthy"], "--ft-restart-policy min-healthy", ftconfig.MIN_HEALTHY),
        (["--restart_policy", "min-healthy"], "--ft-restart-policy min-healthy", ftconfig.MIN_HEALTHY),
        (["--ft-use-infra-group-rank", "False"], "--ft-use-infra-group-rank",
         ftconfig.IGNORED["use_infra_group_rank"]),
        (["--ft-log_level", "DEBUG"], "--ft-log-level", ftconfig.IGNORED["log_level"]),
        (["--ft_param_pci_topo_file", "/x"], "--ft-pci-topo-file", ftconfig.IGNORED["pci_topo_file"]),
    ],
)  # fmt: skip
def test_what_is_ignored_says_why(argv: list[str], ignored: str, why: str, tmp_path: Path) -> None:
    assert _config(tmp_path, *argv).ft.ignored == ((ignored, why),)


def test_a_restart_policy_ft_launcher_never_had_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--ft-restart-policy 'sometimes': expected any-failed or min-"):
        _config(tmp_path, "--ft-restart-policy", "sometimes")


def test_the_no_restart_exit_code_yields_to_abort_exit_code(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "--ft-no-restart-exit-code", "17", "--abort-exit-code", "3")
    assert cfg.policy.exit_codes.abort == 3
    with pytest.raises(ConfigError, match="--ft-no-restart-exit-code '300': expected an exit code"):
        _config(tmp_path, "--ft-no-restart-exit-code", "300")


def test_term_timeout_is_the_grace_after_a_stop_signal_only(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "--term-timeout", "2m", "--workers-stop-timeout", "20")
    assert (cfg.term_timeout, cfg.shutdown_timeout) == (120.0, 20.0)
    assert _config(tmp_path).term_timeout is None  # --shutdown-timeout's then

