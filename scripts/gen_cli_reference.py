"""Write docs/reference/cli.md from the command line's own argparse parser
(supervisor.cli.build_parser): every subcommand, every option, every spelling.

    python scripts/gen_cli_reference.py

``tests/unit/test_docs_reference.py`` fails while the file and the parser differ,
or when an option string of any subcommand is missing from the page.

The page must not depend on the machine that writes it: the parser is built in an
environment without torchrun's ``PET_*`` or nvidia-resiliency-ext's ``FT_*``
variables (they set defaults), and with a ranks' interpreter that has no torch, so
torchrun's options come from the table of the pinned torch the package carries.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

TARGET = Path(__file__).resolve().parent.parent / "docs" / "reference" / "cli.md"

INTRO = """\
# Command line

<!-- written by scripts/gen_cli_reference.py from supervisor/cli's parser: do not edit -->

Every subcommand of `ft-supervisor` and every option it accepts, read from the parser
itself. `ft-supervisor run --help` shows the essential options and `--help-all` all of
them; this page lists all of them, with every spelling (torchrun's underscore forms,
nvidia-resiliency-ext's `--ft-*` variants). A setting that takes seconds accepts `90`,
`90.5`, `90s`, `5m`, `2h`, `1d` or `1h30m`.

torchrun's options are those of torch {torch} (the table the package carries); under
another torch in the ranks' interpreter its own parser is asked, and an option unknown
here is accepted and reported. Where a torchrun option has a `PET_<NAME>` variable, that
variable sets its default, as under torchrun; the `--ft-*` settings also read
`FT_<SETTING>` variables and a config file (`--ft-cfg-path`).

Options marked *accepted, ignored* are nvidia-resiliency-ext settings with no meaning here:
an `ft_launcher` command line that gives them still runs, and the run reports each once,
with why, in its `settings_ignored` event.
"""


@contextlib.contextmanager
def _neutral_environment() -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update({k: v for k in ("PATH", "HOME", "LANG") if (v := saved.get(k)) is not None})
    # a ranks' interpreter that cannot run: no torch, so the pinned torch's table
    os.environ["PYTHON_EXEC"] = "/nonexistent/ft-supervisor-docs/python"
    os.environ["COLUMNS"] = "100"  # argparse wraps the usage lines to the terminal's width
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def parser() -> argparse.ArgumentParser:
    from supervisor.cli import build_parser  # noqa: PLC0415 - after the environment is set

    with _neutral_environment():
        return build_parser()


def subcommands(p: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, summary, parser) for each subcommand, in the parser's order."""
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    return [(name, helps.get(name, ""), sp) for name, sp in sub.choices.items()]


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _help(action: argparse.Action, run: argparse.ArgumentParser | None = None) -> str:
    """The option's help; for one declared without (``classify``'s copies of ``run``'s
    policy options), the help of ``run``'s option of the same name."""
    text = getattr(action, "full_help", action.help)
    if not text and run is not None:
        same = next((a for a in run._actions if a.dest == action.dest and a is not action), None)
        if same is not None and (inherited := _help(same)):
            return f"as for `run`: {inherited}"
    if text == argparse.SUPPRESS or not text:
        from supervisor.config.ft_settings import IGNORED  # noqa: PLC0415

        why = IGNORED.get(action.dest.removeprefix("ft_"))
        if why is not None:
            return f"*accepted, ignored*: {why}"
        if action.dest == "ft_ignore_missing_cfg":
            return "*accepted*: without a config file the defaults apply, as ft_launcher does with it"
        return ""
    return str(text)


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "-"
    if action.choices is not None and not isinstance(action.choices, dict):
        return " \\| ".join(f"`{c}`" for c in action.choices)
    metavar = action.metavar or action.dest.upper()
    return f"`{metavar}`"


def _default(action: argparse.Action) -> str:
    default = action.default
    if action.nargs == 0 or default in (None, argparse.SUPPRESS, False, [], ""):
        return "-"
    if isinstance(default, list | tuple):
        default = ",".join(map(str, default))
    if isinstance(default, float) and default.is_integer():
        default = int(default)
    return f"`{_cell(default)}`"


def _names(action: argparse.Action) -> str:
    first, *rest = action.option_strings
    shown = f"`{first}`"
    if rest:
        shown += "<br><small>" + " ".join(f"`{s}`" for s in rest) + "</small>"
    return shown


def _command(name: str, summary: str, sp: argparse.ArgumentParser, run: argparse.ArgumentParser) -> str:
    usage = sp.format_usage().strip().removeprefix("usage: ")
    out = [f"\n## {name}\n\n{_cell(summary)}\n\n```\n{usage}\n```\n"]
    for group in sp._action_groups:
        actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        title = group.title or ""
        if title not in ("options", "positional arguments"):
            out.append(f"\n### {_cell(title)}\n")
        out.append("\n| option | value | default | meaning |\n|---|---|---|---|\n")
        for a in actions:
            names = _names(a) if a.option_strings else f"`{a.metavar or a.dest}`"
            value = "" if not a.option_strings else _value(a)
            out.append(f"| {names} | {value} | {_default(a)} | {_cell(_help(a, run))} |\n")
    return "".join(out)


def render() -> str:
    with _neutral_environment():
        return _render()


def _render() -> str:
    from supervisor.config import torchrun_table  # noqa: PLC0415

    p = parser()
    out = [INTRO.replace("{torch}", torchrun_table.TORCH_VERSION)]
    commands = subcommands(p)
    out.append("\n| command | what it does |\n|---|---|\n")
    out += [f"| [`{name}`](#{name}) | {_cell(summary)} |\n" for name, summary, _ in commands]
    run = next(sp for name, _, sp in commands if name == "run")
    out += [_command(name, summary, sp, run) for name, summary, sp in commands]
    return "".join(out)


def main() -> int:
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(render())
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
