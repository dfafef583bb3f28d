"""Config and rules files read within bounds: no file can wedge or kill the daemon
(issue 12: a self-referencing alias, a billion-laughs file, a huge file, a byte that
is not UTF-8). Every problem is the reading module's error type, in one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.config import files as configfile
from supervisor.config import ft as ftconfig
from supervisor.config.errors import ConfigError
from supervisor.config.files import MAX_BYTES, MAX_DEPTH
from supervisor.config.policy import load_rules_file, user_rules

SELF_ALIAS = b"a: &a [*a]\n"  # the 11 bytes of the issue: a list that holds itself
# 9 lists of 9 references to the one before: 9^9 (387 million) strings to whoever walks it
LAUGHS = b'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + b"".join(
    b"%c: &%c [%s]\n" % (name, name, b",".join([b"*%c" % prev] * 9))
    for prev, name in zip(b"abcdefgh", b"bcdefghi", strict=True)
)


YAML_CASES = [
    "self-alias", "billion-laughs", "alias", "merge-key", "depth", "deep", "utf8", "two-docs",
    "huge-int", "size",
]  # fmt: skip


def _nested(depth: int, kind: str) -> bytes:
    """A document of ``depth`` levels: a mapping, holding ``depth - 1`` nested lists."""
    depth -= 1
    value = b"[" * depth + b"]" * depth
    return b"a: " + value if kind == "yaml" else b"a = " + value


@pytest.mark.timeout(10)  # the walk of the old code never ends: fail fast instead
@pytest.mark.parametrize(
    ("data", "said"),
    [
        (SELF_ALIAS, "not valid YAML: anchor &a: anchors and aliases are not accepted (line 1, column 4)"),
        (LAUGHS, "not valid YAML: anchor &a: anchors and aliases are not accepted"),
        (b"x: 1\ny: *x\n", "not valid YAML: alias *x: anchors and aliases are not accepted (line 2"),
        (b"base: &b {k: 1}\nfault_tolerance:\n  <<: *b\n", "anchor &b"),  # a merge key needs one
        (_nested(MAX_DEPTH + 1, "yaml"), f"not valid YAML: nested deeper than {MAX_DEPTH} levels"),
        (_nested(5000, "yaml"), f"nested deeper than {MAX_DEPTH} levels"),  # pyyaml alone would recurse
        (b"fault_tolerance:\n  log_level: \xff\n", "not UTF-8: byte 0xff at offset 30"),
        (b"a: 1\n---\nb: 2\n", "expected a single document in the stream, but found another document"),
        (b"a: " + b"1" * 5000 + b"\n", "not valid YAML: Exceeds the limit (4300 digits)"),  # a ValueError
        (b"#" * (MAX_BYTES + 1), "larger than 1048576 bytes (1 MiB)"),
    ],
    ids=YAML_CASES,
)
def test_a_bad_yaml_file_is_refused_in_one_line(data: bytes, said: str) -> None:
    with pytest.raises(ConfigError) as err:
        configfile.parse(data, "yaml")
    assert said in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("data", "said"),
    [
        (_nested(MAX_DEPTH + 1, "toml"), f"not valid TOML: nested deeper than {MAX_DEPTH} levels"),
        (_nested(5000, "toml"), f"not valid TOML: nested deeper than {MAX_DEPTH} levels"),  # RecursionError
        # tomllib's time is quadratic in a key's parts: this one would take ten minutes
        (b"a" + b".a" * 200_000 + b" = 1\n", f"not valid TOML: a dotted key of more than {MAX_DEPTH} parts"),
        (b'"a"' + b'."a"' * MAX_DEPTH + b" = 1\n", "a dotted key of more than"),
        (b"[" + b"a." * MAX_DEPTH + b"a]\n", "a dotted key of more than"),
        (b"x = {" + b"a." * MAX_DEPTH + b"a = 1}\n", "a dotted key of more than"),
        (b"[fault_tolerance]\nlog_level = '\xc3'\n", "not UTF-8: byte 0xc3 at offset 31"),
        (b"a = [1,\n", "not valid TOML: "),
        (b"x = 1\n" + b"#" * MAX_BYTES, "larger than 1048576 bytes (1 MiB)"),
    ],
    ids=["depth", "deep", "dotted", "quoted-keys", "table", "inline-table", "utf8", "syntax", "size"],
)
def test_a_bad_toml_file_is_refused_in_one_line(data: bytes, said: str) -> None:
    with pytest.raises(ConfigError) as err:
        configfile.parse(data, "toml")
    assert said in str(err.value)
    assert "\n" not in str(err.value)


def test_good_files_still_parse() -> None:
    nvrx = b"model:\n  layers: 4\ntraining:\n  fault_tolerance:\n    rank_heartbeat_timeout: 10\n"
    assert configfile.parse(nvrx, "yaml") == {
        "model": {"layers": 4},
        "training": {"fault_tolerance": {"rank_heartbeat_timeout": 10}},
    }
    with_bom = b"\xef\xbb\xbf[fault_tolerance]\nx = 1\n"
    assert configfile.parse(with_bom, "toml") == {"fault_tolerance": {"x": 1}}
    assert configfile.parse("a: caf\u00e9 \u2713\n".encode(), "yaml") == {"a": "caf\u00e9 \u2713"}
    assert configfile.parse(b"", "yaml") is None
    # the limits themselves are allowed
    assert configfile.parse(_nested(MAX_DEPTH, "yaml"), "yaml") is not None
    assert configfile.parse(_nested(MAX_DEPTH, "toml"), "toml") is not None
    assert configfile.parse(b"#" * MAX_BYTES, "yaml") is None
    # dots in strings, comments and numbers are not key parts
    rules = (
        b"# " + b"." * 100 + b"\n[[rule]]\nid = 'U.1'\nany = ['" + b"a\\." * 100 + b"']\n"
        b'summary = """\n' + b"." * 100 + b'\n"""\nx = [' + b"1.5, " * 100 + b"1.5]\n"
    )
    assert configfile.parse(rules, "toml")["rule"][0]["id"] == "U.1"  # type: ignore[index]
    assert configfile.parse(b"a" + b".a" * (MAX_DEPTH - 2) + b" = 1\n", "toml") is not None


def test_files_that_are_not_regular_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "cfg.yaml"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer
    with pytest.raises(ConfigError, match="not a regular file"):
        configfile.read(fifo, "yaml")
    with pytest.raises(ConfigError, match="not a regular file"):
        configfile.read(tmp_path, "yaml")
    with pytest.raises(FileNotFoundError):
        configfile.read(tmp_path / "nope.yaml", "yaml")


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("data", "said"),
    [
        (SELF_ALIAS, "not valid YAML: anchor &a"),
        (LAUGHS, "not valid YAML: anchor &a"),
        (b"fault_tolerance:\n  log_level: \xff\n", "not UTF-8: byte 0xff at offset 30"),
        (b"fault_tolerance: {}\n" + b"#" * MAX_BYTES, "larger than 1048576 bytes"),
    ],
    ids=["self-alias", "billion-laughs", "utf8", "size"],
)
def test_the_config_file_reports_them_as_config_errors(tmp_path: Path, data: bytes, said: str) -> None:
    cfg = tmp_path / "ft.yaml"
    cfg.write_bytes(data)
    with pytest.raises(ConfigError) as err:
        ftconfig.load({}, {}, cfg)
    assert str(err.value).startswith(f"config file {cfg}: {said}")


@pytest.mark.timeout(10)
def test_the_section_search_visits_each_part_once() -> None:
    looped: list[object] = []
    looped.append(looped)  # what pyyaml builds from the 11 bytes
    assert ftconfig._find_section({"a": looped}) is None
    level: list[object] = ["lol"] * 9
    for _ in range(9):
        level = [level] * 9  # the billion laughs, as shared references
    assert ftconfig._find_section({"x": level, "y": [{"fault_tolerance": {"k": 1}}]}) == {"k": 1}


def test_keys_that_are_not_strings_are_ignored_like_other_unknown_keys(tmp_path: Path) -> None:
    cfg = tmp_path / "ft.yaml"
    cfg.write_text("fault_tolerance:\n  1: 2\n  null: 3\n  rank_heartbeat_timeout: 5\n")
    loaded = ftconfig.load({}, {}, cfg)
    assert loaded.rank_heartbeat_timeout == 5.0
    assert [option for option, _ in loaded.ignored] == [f"{cfg}: 1", f"{cfg}: none"]


def test_a_huge_value_is_quoted_short(tmp_path: Path) -> None:
    cfg = tmp_path / "ft.yaml"
    cfg.write_text("fault_tolerance:\n  rank_heartbeat_timeout: [" + "1, " * 20_000 + "1]\n")  # 60 KB
    with pytest.raises(ConfigError) as err:
        ftconfig.load({}, {}, cfg)
    assert len(str(err.value)) < 300 and "expected a duration" in str(err.value)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("name", "data", "said"),
    [
        ("rules.yaml", b"rules: &r [*r]\n", "not valid YAML: anchor &r"),
        ("rules.yaml", LAUGHS, "not valid YAML: anchor &a"),
        ("rules.toml", b'[[rule]]\nid = "U1"\nany = ["\xe9"]\n', "not UTF-8: byte 0xe9 at offset 27"),
        ("rules.toml", b"#" * (MAX_BYTES + 1), "larger than 1048576 bytes"),
        ("rules.toml", b"rule = " + b"[" * 100 + b"]" * 100, "not valid TOML: nested deeper than"),
    ],
    ids=["self-alias", "billion-laughs", "utf8", "size", "depth"],
)
def test_a_bad_rules_file_is_a_policy_error(tmp_path: Path, name: str, data: bytes, said: str) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ConfigError) as err:
        load_rules_file(str(path))
    assert str(err.value).startswith(f"--rules {path}: {said}")


def test_a_good_rules_file_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n  - id: SITE1\n    any: ['filer \\S+ unreachable']\n    action: reschedule\n")
    assert [r["id"] for r in user_rules([str(path)])] == ["SITE1"]
    missing = tmp_path / "none.toml"
    with pytest.raises(ConfigError, match=f"--rules {missing}: cannot read it: No such file"):
        load_rules_file(str(missing))


@pytest.mark.timeout(10)
def test_without_libyaml_pyyamls_own_parser_keeps_the_same_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml  # noqa: PLC0415

    monkeypatch.setattr(yaml, "__with_libyaml__", False)
    configfile._loader.cache_clear()
    try:
        assert configfile._loader().__name__ == "PureLoader"
        for data, said in [(SELF_ALIAS, "anchor &a"), (LAUGHS, "anchor &a"), (b"a: \x00\n", "unacceptable"),
                           (_nested(MAX_DEPTH + 1, "yaml"), "nested deeper than")]:  # fmt: skip
            with pytest.raises(ConfigError, match=said):
                configfile.parse(data, "yaml")
        assert configfile.parse(_nested(MAX_DEPTH, "yaml"), "yaml") is not None
    finally:
        configfile._loader.cache_clear()
