"""Write docs/reference/rules.md: the rules file's schema, from supervisor.core.rules
(its keys, ``RULE_KEYS``, described in the module's docstring, and the defaults
``compile_rule`` fills in), and the built-in rule table, from the rules the built-in
classifier plugin loads (found through its entry point, as the daemon finds it).

    python scripts/gen_rules_reference.py

``tests/unit/test_docs_reference.py`` fails while the file and the code differ, when a
key is missing from the docstring, or a built-in rule from the table.
"""

from __future__ import annotations

import signal
from pathlib import Path

from supervisor.core import rules as rules_module
from supervisor.core.rules import RULE_KEYS, Rule, compile_rule

TARGET = Path(__file__).resolve().parent.parent / "docs" / "reference" / "rules.md"

INTRO = """\
# Failure rules

<!-- written by scripts/gen_rules_reference.py from supervisor/core/rules.py and the
     built-in rules (plugins/rules/*.toml): do not edit -->

A rule says what a failure looks like (lines of text, an exit code, a signal, a hang)
and what it implies. The built-in classifier is a rule set kept as data; your rules,
given with `--rules FILE` (repeatable) or as `rules` in the config file, are tried
first, and a rule with a built-in's id replaces it. `ft-supervisor plugins --list-rules`
lists the rules a run would load, yours included; `ft-supervisor classify` runs them
offline on logs or a run directory.

A rules file is TOML with `[[rule]]` tables, or YAML (by its `.yaml`/`.yml` suffix) with
a `rules:` list:

```toml
[[rule]]
id = "SITE1"                       # a new id, or a built-in's to replace it
any = ["filer \\\\S+ unreachable"]    # regexes, one line at a time
category = "storage"
nature = "hardware"                # what running out of restarts means
action = "reschedule"              # on a first occurrence
repeat = "abort"                   # once seen `after` (1) times on this node
summary = "the site's filer is down"
```

Patterns are RE2's ([syntax](https://github.com/google/re2/wiki/Syntax)): matching takes
time linear in the line, so no pattern can stall the daemon. RE2 is Python's syntax
without backreferences and lookaround (`\\Z` is written `\\z`). A file that breaks a rule
of the schema (an unknown key, a bad value, a pattern RE2 rejects) fails `run` with one
line naming the rule and the key (exit 2); on SIGHUP the old rules stay.

## Keys

{count} keys. A rule needs an `id` and something to match: `any`, `all`, `exit`,
`signal` or `hang`; `any` and `all` exclude each other.

| key | default | meaning |
|---|---|---|
"""

# what compile_rule fills in for a key left out, read off a compiled rule
_DEFAULT_OF = {
    "category": lambda r: r.category,
    "nature": lambda r: r.nature,
    "action": lambda r: str(r.action),
    "after": lambda r: r.after,
    "scope": lambda r: ", ".join(r.scope),
    "when": lambda r: "before_first_step" if r.before_first_step else "always",
    "blame": lambda r: "peer" if r.blame_peer else "self",
    "wrapper": lambda r: str(r.wrapper).lower(),
    "fallback": lambda r: str(r.fallback).lower(),
}


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def key_docs() -> dict[str, str]:
    """Each key's description, from the field list in supervisor.core.rules' docstring."""
    doc = rules_module.__doc__ or ""
    block = doc.split("The fields::", 1)[1]
    out: dict[str, list[str]] = {}
    current = None
    for line in block.splitlines()[1:]:
        if not line.strip():
            if out:
                break
            continue
        if not line.startswith("    "):
            break
        if line.startswith("     "):  # a continuation
            if current is not None:
                out[current].append(line.strip())
            continue
        key, _, text = line.strip().partition(" ")
        current = key
        out[key] = [text.strip()]
    return {k: " ".join(v) for k, v in out.items()}


def _md(text: str) -> str:
    """The docstring's ``literal`` as Markdown's `literal`."""
    return _cell(text.replace("``", "`"))


def builtin_rules() -> tuple[Rule, ...]:
    """The rules the built-in classifier loads, in the order they are tried."""
    from supervisor.hooks import PluginSettings  # noqa: PLC0415
    from supervisor.hooks.registry import Registry  # noqa: PLC0415

    registry = Registry()
    registry.configure(PluginSettings())
    return tuple(getattr(registry.pm.get_plugin("rules"), "rules", ()))


def _matches(rule: Rule) -> str:
    parts = []
    if rule.any:
        parts.append(f"any of {len(rule.any)} pattern{'s' * (len(rule.any) > 1)}")
    if rule.all:
        parts.append(f"all of {len(rule.all)} patterns, in order")
    if rule.exit_codes:
        parts.append("exit " + ", ".join(map(str, sorted(rule.exit_codes))))
    if rule.signals:
        parts.append(", ".join(signal.Signals(s).name for s in sorted(rule.signals)))
    if rule.hang:
        parts.append("a hang")
    if rule.scope != ("rank",):
        parts.append("in " + ", ".join(rule.scope))
    flags = [f for f, on in (("wrapper", rule.wrapper), ("fallback", rule.fallback)) if on]
    if rule.blame_peer:
        flags.append("blames a peer")
    if rule.before_first_step:
        flags.append("before the first step")
    return "; ".join(parts + flags)


def _action(rule: Rule) -> str:
    text = str(rule.action)
    if rule.by:
        text += " (by " + ", ".join(rule.by) + ")"
    if rule.repeat is not None:
        text += f", then {rule.repeat}" + (f" after {rule.after}" if rule.after != 1 else "")
    return text


def render() -> str:
    docs = key_docs()
    missing = sorted(RULE_KEYS - set(docs))
    if missing:
        raise SystemExit(f"supervisor/core/rules.py's docstring does not describe {missing}")
    defaults = compile_rule({"id": "X", "hang": True})
    out = [INTRO.replace("{count}", str(len(RULE_KEYS)))]
    for key in docs:
        if key not in RULE_KEYS:
            raise SystemExit(f"supervisor/core/rules.py's docstring describes {key!r}, not a rule key")
        default = _DEFAULT_OF.get(key)
        shown = "-" if default is None else f"`{default(defaults)}`"
        out.append(f"| `{key}` | {shown} | {_md(docs[key])} |\n")
    table = builtin_rules()
    out.append(
        f"\n## Built-in rules\n\n{len(table)} rules, in the order they are tried (a third party's "
        "classifier plugin is asked before them, your rules before the built-in ones). The "
        "patterns are in the source file named.\n\n"
        "| id | category | nature | action | matches | summary | source |\n|---|---|---|---|---|---|---|\n"
    )
    for r in table:
        out.append(
            f"| `{r.id}` | {r.category} | {r.nature} | {_cell(_action(r))} | {_cell(_matches(r))} "
            f"| {_cell(r.summary)} | `{r.source}` |\n"
        )
    return "".join(out)


def main() -> int:
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(render())
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
