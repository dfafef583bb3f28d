"""Write supervisor/config/torchrun_table.py from the installed torch's torchrun parser.

Run it with the pinned torch installed, after changing the pin in constraints.txt:

    .venv/bin/python scripts/gen_torchrun_table.py

``tests/unit/test_torchrun_options.py`` fails while the table and the installed
torch's parser differ.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from supervisor.config.torchrun import introspect

TARGET = Path(__file__).resolve().parent.parent / "supervisor" / "config" / "torchrun_table.py"


def render(version: str) -> str:
    _, options = introspect(sys.executable, os.environ)
    public = version.split("+", 1)[0]
    rows = "\n".join(
        f"    ({o.dest!r}, {o.flags!r}, {o.flag!r}, {o.default!r}, {o.choices!r}, {o.type!r}, {o.env!r}),"
        for o in options
    )
    return (
        f'"""torchrun\'s options in torch {public}, from its own parser: written by\n'
        "scripts/gen_torchrun_table.py, do not edit. One row per option: dest, spellings,\n"
        "takes no value, torch's default, choices, the name of its type, whether PET_<DEST>\n"
        'sets its default."""\n\n'
        "# ruff: noqa: E501\n\n"
        "from __future__ import annotations\n\n"
        "from typing import Any\n\n"
        f"TORCH_VERSION = {public!r}\n\n"
        "# fmt: off\n"
        "OPTIONS: tuple[tuple[Any, ...], ...] = (\n"
        f"{rows}\n"
        ")\n"
        "# fmt: on\n"
    )


def main() -> int:
    from importlib.metadata import version  # noqa: PLC0415

    TARGET.write_text(render(version("torch")))
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
