"""``ft-supervisor classify`` and ``ft-supervisor plugins``, as an SRE runs them. classify on the
run directories a daemon leaves: tests/fast/test_postmortem_runs.py; on a real torchrun log (the
rank torchrun reports): tests/integration/test_torch_ranks.py, on the log of the torchrun run
that test compares our ranks with."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from supervisor.postmortem import KEEP_FIRST, KEEP_LAST, TAIL, scan
from tests.support import REPO

CORPUS = REPO / "tests" / "fixtures" / "failures"
WATCHDOG = (
    "[rank1]:[E1122 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=37, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=600000) ran for 600045 milliseconds before timing out."
)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor", *args], capture_output=True, text=True, timeout=60
    )


def test_classify_a_log_and_a_kernel_log(tmp_path: Path) -> None:
    log = tmp_path / "rank3.log"
    log.write_text(
        "step 811 loss 2.3\n"
        "[rank3]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "[rank3]: CUDA kernel errors might be asynchronously reported at some other API call\n"
    )
    r = _cli("classify", str(log))
    assert r.returncode == 0, r.stderr
    assert "rule:     C2 [cuda, transient]" in r.stdout
    assert "decision: restart" in r.stdout
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in r.stdout
    dmesg = tmp_path / "dmesg.txt"
    dmesg.write_text("[ 1234.5] NVRM: Xid (PCI:0000:3b:00): 95, pid=4242, name=python, Uncontained ECC\n")
    out = json.loads(_cli("classify", "--json", str(log), "--dmesg", str(dmesg)).stdout)
    assert out["classification"]["rule"] == "H1"
    assert out["decision"]["action"] == "reschedule"


def test_user_rules_reach_lines_without_a_keyword(tmp_path: Path) -> None:
    log = tmp_path / "r.log"
    log.write_text("step 1\nfiler fs7 unreachable\n")
    rules = tmp_path / "site.yaml"
    rules.write_text("rules:\n  - id: SITE1\n    any: ['filer \\S+ unreachable']\n    action: reschedule\n")
    assert json.loads(_cli("classify", "--json", str(log)).stdout)["classification"]["rule"] == "unclassified"
    out = json.loads(_cli("classify", "--json", "--rules", str(rules), str(log)).stdout)
    assert (out["classification"]["rule"], out["decision"]["action"]) == ("SITE1", "reschedule")


def test_plugins_lists_what_loads_and_names_bad_input(tmp_path: Path) -> None:
    out = json.loads(_cli("plugins", "--json").stdout)
    assert [p["name"] for p in out["loaded"]] == ["rules"]
    assert {"N1", "C3", "D1", "P1", "HANG"} <= {r["id"] for r in out["rules"]}
    off = json.loads(_cli("plugins", "--json", "--disable-plugins", "rules").stdout)
    assert (off["loaded"], off["disabled"]) == ([], ["rules"])
    bad = tmp_path / "bad.toml"
    bad.write_text('[[rule]]\nid = "B1"\nany = ["x"]\naction = "explode"\n')
    r = _cli("plugins", "--rules", str(bad))
    assert r.returncode != 0
    assert "rule 'B1': action must be one of continue, restart, reschedule, abort" in r.stderr
    r = _cli("classify")
    assert r.returncode == 2 and "give at least one log" in r.stderr
    r = _cli("classify", str(tmp_path / "nope.log"))
    assert r.returncode == 2 and "no such file or directory" in r.stderr


def test_a_big_noisy_log_keeps_a_bounded_number_of_lines(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    with log.open("w") as f:
        for i in range(200_000):
            f.write(f"step {i} WARNING: retrying after error {i}\n" if i % 2 else f"step {i} ok\n")
        f.write("x" * 300_000)  # and a runaway last line with no newline
    kept, tail = scan(log)
    assert len(kept) == KEEP_FIRST + KEEP_LAST
    assert kept[0] == "step 1 WARNING: retrying after error 1"
    assert kept[-1] == "step 199999 WARNING: retrying after error 199999"
    assert len(tail) == TAIL and len(tail[-1]) <= 300_000


def test_a_single_rank_log_is_named_by_its_rank_prefix(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    log.write_text(
        "step 811 loss 2.3\n"
        "[rank3]: Traceback (most recent call last):\n"
        '[rank3]:   File "/job/train.py", line 9, in <module>\n'
        "[rank3]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    out = json.loads(_cli("classify", "--json", str(log)).stdout)
    assert (out["classification"]["rule"], out["classification"]["rank"]) == ("C2", 3)


def test_an_ft_launcher_hang_is_a_hang_of_the_rank_it_names() -> None:
    out = json.loads(_cli("classify", "--json", str(CORPUS / "hang_ft_launcher_section_agent.log")).stdout)
    c = out["classification"]
    assert (c["rule"], c["rank"], c["category"]) == ("HANG", 1, "hang"), out
    assert c["lines"][0].startswith("hung: rank 1: section 'step' open for 3.120 s")


def test_a_console_of_several_ranks_names_the_rank_whose_line_explains_the_failure(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_text(
        "[rank0]: step 811 loss 2.3\n"
        "[rank2]: Traceback (most recent call last):\n"
        "[rank2]: ZeroDivisionError: division by zero\n"
        f"{WATCHDOG}\n"
        "[rank0]: step 812 loss 2.2\n"
    )
    out = json.loads(_cli("classify", "--json", str(log)).stdout)
    assert (out["classification"]["rule"], out["classification"]["rank"]) == ("N1", 1)
