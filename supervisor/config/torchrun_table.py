"""torchrun's options in torch 2.13.0, from its own parser: written by
scripts/gen_torchrun_table.py, do not edit. One row per option: dest, spellings,
takes no value, torch's default, choices, the name of its type, whether PET_<DEST>
sets its default."""

# ruff: noqa: E501

from __future__ import annotations

from typing import Any

TORCH_VERSION = '2.13.0'

# fmt: off
OPTIONS: tuple[tuple[Any, ...], ...] = (
    ('nnodes', ('--nnodes',), False, '1:1', None, 'str', True),
    ('nproc_per_node', ('--nproc-per-node', '--nproc_per_node'), False, '1', None, 'str', True),
    ('rdzv_backend', ('--rdzv-backend', '--rdzv_backend'), False, 'static', None, 'str', True),
    ('rdzv_endpoint', ('--rdzv-endpoint', '--rdzv_endpoint'), False, '', None, 'str', True),
    ('rdzv_id', ('--rdzv-id', '--rdzv_id'), False, 'none', None, 'str', True),
    ('rdzv_conf', ('--rdzv-conf', '--rdzv_conf'), False, '', None, 'str', True),
    ('standalone', ('--standalone',), True, False, None, 'str', True),
    ('max_restarts', ('--max-restarts', '--max_restarts'), False, 0, None, 'int', True),
    ('monitor_interval', ('--monitor-interval', '--monitor_interval'), False, 0.1, None, 'float', True),
    ('start_method', ('--start-method', '--start_method'), False, 'spawn', ('spawn', 'fork', 'forkserver'), 'str', True),
    ('event_log_handler', ('--event-log-handler', '--event_log_handler'), False, 'null', None, 'str', True),
    ('role', ('--role',), False, 'default', None, 'str', True),
    ('module', ('-m', '--module'), True, False, None, 'str', True),
    ('no_python', ('--no-python', '--no_python'), True, False, None, 'str', True),
    ('run_path', ('--run-path', '--run_path'), True, False, None, 'str', True),
    ('log_dir', ('--log-dir', '--log_dir'), False, None, None, 'str', True),
    ('redirects', ('-r', '--redirects'), False, '0', None, 'str', True),
    ('tee', ('-t', '--tee'), False, '0', None, 'str', True),
    ('local_ranks_filter', ('--local-ranks-filter', '--local_ranks_filter'), False, '', None, 'str', True),
    ('duplicate_stdout_filters', ('--duplicate-stdout-filters', '--duplicate_stdout_filters'), False, [], None, 'comma_separated_list', True),
    ('duplicate_stderr_filters', ('--duplicate-stderr-filters', '--duplicate_stderr_filters'), False, [], None, 'comma_separated_list', True),
    ('node_rank', ('--node-rank', '--node_rank'), False, 0, None, 'int', True),
    ('master_addr', ('--master-addr', '--master_addr'), False, '127.0.0.1', None, 'str', True),
    ('master_port', ('--master-port', '--master_port'), False, None, None, 'int', True),
    ('local_addr', ('--local-addr', '--local_addr'), False, None, None, 'str', True),
    ('logs_specs', ('--logs-specs', '--logs_specs'), False, None, None, 'str', False),
    ('numa_binding', ('--numa-binding', '--numa_binding'), False, None, ('node', 'socket', 'exclusive', 'core-complex'), 'str', False),
    ('signals_to_handle', ('--signals-to-handle', '--signals_to_handle'), False, 'SIGTERM,SIGINT,SIGHUP,SIGQUIT', None, 'str', True),
    ('shutdown_timeout', ('--shutdown-timeout', '--shutdown_timeout'), False, None, None, 'int', True),
    ('virtual_local_rank', ('--virtual-local-rank', '--virtual_local_rank'), True, False, None, 'str', True),
)
# fmt: on
