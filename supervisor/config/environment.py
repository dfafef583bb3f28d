"""Our own options' precedence: the command line, then ``FT_SUPERVISOR_<OPTION>``.

``--reschedule-exit-code`` reads ``FT_SUPERVISOR_RESCHEDULE_EXIT_CODE`` when not given,
which suits a container image whose entrypoint is fixed and whose environment is not.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any


def env_name(option: str) -> str:
    return "FT_SUPERVISOR_" + option.lstrip("-").replace("-", "_").upper()


def pick(ns: argparse.Namespace, environ: Mapping[str, str], option: str) -> Any:
    """The option's value from the command line, else its variable's, else None."""
    value = getattr(ns, option.lstrip("-").replace("-", "_"), None)
    if value is not None:
        return value
    return environ.get(env_name(option))
