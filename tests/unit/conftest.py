"""The ranks' torch, asked once: the programs ft-supervisor runs in the ranks' interpreter
(``supervisor.config.run._COUNT``: torchrun's count of --nproc-per-node; ``torchrun.INTROSPECT``:
torch's torchrun parser) import torch, 2.7 CPU-s a child. Each program is run here, by this
torch, in ONE child for the whole session (every xdist worker reads that child's answers),
and a stand-in interpreter replays those answers to the code under test: ft-supervisor still
starts its child, hands it its program and reads what torch said, exit code included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from supervisor.config import torchrun
from supervisor.config.run import _COUNT

# (program, its arguments): every question the unit tests put to the ranks' torch
QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (_COUNT, ("xpu",)),  # a device torch knows, absent here
    (_COUNT, ("auto",)),  # no accelerator: the CPUs
    (_COUNT, ("zero",)),  # not a device torch knows
    (torchrun.INTROSPECT, ()),
)

# Runs each program as `python -c PROGRAM ARGS...` would, in this one process: its stdout,
# stderr and exit status (an uncaught exception: its traceback and 1, as the interpreter)
_ASK = """
import contextlib, io, json, sys, traceback
questions, target, answers = json.loads(sys.argv[1]), sys.argv[2], []
for code, args in questions:
    out, err, rc = io.StringIO(), io.StringIO(), 0
    sys.argv = ["-c", *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, int) and exc.code is not None:
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            rc = 1
    said = {"stdout": out.getvalue(), "stderr": err.getvalue(), "rc": rc}
    answers.append({"argv": ["-c", code, *args], **said})
with open(target, "w") as f:
    json.dump(answers, f)
"""

# The stand-in: a recorded program gets torch's answer; any other runs in the real interpreter
# (ft-supervisor's torch version check: package metadata, no torch). torch's parser reads PET_*
# into its defaults, so PET_* reaching INTROSPECT would have changed its answer: refused.
_REPLAY = """#!{python}
import json, os, sys
argv = sys.argv[1:]
if argv[:1] != ["-c"] or argv[1:2] != [{introspect!r}] and argv[1:2] != [{count!r}]:
    os.execv({python!r}, [{python!r}, *argv])
pet = sorted(k for k in os.environ if k.startswith("PET_"))
if pet and argv[1] == {introspect!r}:
    sys.exit(f"PET_* variables reached torch's parser: {{pet}}")
for a in json.load(open({answers!r})):
    if a["argv"] == argv:
        sys.stdout.write(a["stdout"])
        sys.stderr.write(a["stderr"])
        sys.exit(a["rc"])
sys.exit(f"tests/unit/conftest.py: no recorded answer of torch for {{argv[2:]}}: add it to QUESTIONS")
"""


def _record(answers: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    questions = json.dumps([[code, list(args)] for code, args in QUESTIONS])
    r = subprocess.run([sys.executable, "-c", _ASK, questions, str(answers)], env=env,
                       capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="session")
def asked_torch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An interpreter that answers ft-supervisor's questions to the ranks' torch as this
    torch answered them (asked once a session: xdist's workers share the answers)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's, above every worker's
    answers = shared / "torch-answers.json"
    with FileLock(str(answers) + ".lock"):
        if not answers.exists():
            tmp = answers.with_name(answers.name + f".{os.getpid()}")
            _record(tmp)
            tmp.replace(answers)
    python = tmp_path_factory.mktemp("asked-torch") / "python"
    python.write_text(_REPLAY.format(python=sys.executable, introspect=torchrun.INTROSPECT, count=_COUNT,
                                     answers=str(answers)))  # fmt: skip
    python.chmod(0o755)
    return python
