"""The SLURM recipe (scripts/schedulers/slurm-autoresume.sh) submitted to a real SLURM.

A module fixture starts Debian's slurm-wlm on this host, as root: munged, slurmctld and
two slurmd (nodes n1 and n2 on 127.0.0.1, each with a port of its own), from a slurm.conf
in a temporary directory (no cgroups: proctrack/linuxproc, task/none; free ports). Where
that cannot be had (not root, no binaries, daemons that do not come up) the tests skip
with the reason. Each test sbatches the recipe with a torch-free job
(tests/fixtures/ranks/slurm_train.py) and reads what SLURM says of the job
(`scontrol show job`) and what the job left in its directory. docs/guides/slurm.md says
what this shows and what it does not.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from tests.support import LEAK_KEY, RANKS, alive, wait_until

pytestmark = [pytest.mark.slow]

RECIPE = Path(__file__).parents[2] / "scripts" / "schedulers" / "slurm-autoresume.sh"
JOB = str(RANKS / "slurm_train.py")
NODES = ("n1", "n2")
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo")
# what scripts/test.sh does about it: CI installs slurm-wlm only where apt-get is at hand
NO_SLURM = "Debian's slurm-wlm (munged, slurmctld, slurmd) is needed: apt-get install slurm-wlm"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Slurm:
    root: Path
    env: dict[str, str]

    def cmd(self, *argv: str, check: bool = True) -> str:
        r = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=20, check=False)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr}")
        return r.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (the fields this module reads have no spaces)."""
        text = self.cmd("scontrol", "show", "job", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                         for p in sorted((self.root / "log").glob("*")))  # fmt: skip


def _conf(root: Path, ctld_port: int, node_ports: dict[str, int]) -> str:
    nodes = "\n".join(
        f"NodeName={name} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 Port={port} "
        "CPUs=4 State=UNKNOWN"
        for name, port in node_ports.items()
    )
    return f"""ClusterName=fttest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={next(iter(node_ports.values()))}
CommunicationParameters=NoInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
PlugStackConfig={root}/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
InactiveLimit=0
MinJobAge=600
KillWait=5
Waittime=0
{nodes}
PartitionName=debug Nodes={",".join(node_ports)} Default=YES MaxTime=INFINITE State=UP
"""


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _boot(
    cluster: Slurm, argvs: list[list[str]], procs: list[subprocess.Popen[bytes]], log: IO[bytes]
) -> str:
    """Start the daemons into ``procs``; what went wrong, or "" once both nodes are idle."""
    munge_socket = cluster.root / "munge" / "socket"
    for argv in argvs:
        procs.append(subprocess.Popen(argv, env=cluster.env, stdout=log, stderr=log,
                                      stdin=subprocess.DEVNULL))  # fmt: skip
        if argv[0] == "munged":
            wait_until(lambda: munge_socket.exists() or procs[0].poll() is not None, 10, "munged's socket")

    def ready() -> bool:
        if any(p.poll() is not None for p in procs):
            return True  # no use waiting
        out = cluster.cmd("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        return sorted(out.split()) == sorted([*NODES, "idle", "idle"])

    try:
        wait_until(ready, 30, "both nodes idle", interval=0.2)
    except AssertionError as e:
        return str(e)
    exited = [argv[0] for argv, p in zip(argvs, procs, strict=False) if p.poll() is not None]
    return f"{', '.join(exited)} exited" if exited else ""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    if os.geteuid() != 0:
        pytest.skip("a real SLURM needs root here (slurmd runs jobs as their user)")
    missing = [name for name in DAEMONS if shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin")
               is None]  # fmt: skip
    if missing:
        pytest.skip(f"{NO_SLURM} (missing: {', '.join(missing)})")
    root = tmp_path_factory.mktemp("slurm")
    for d in ("munge", "state", "log", *(f"spool/{n}" for n in NODES)):
        (root / d).mkdir(parents=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    (root / "plugstack.conf").write_text("")
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, _free_port(), {n: _free_port() for n in NODES}))
    # the daemons outlive each test, so they must not carry one test's leak token
    env = {k: v for k, v in os.environ.items() if k != LEAK_KEY and not k.startswith("SLURM")}
    env["SLURM_CONF"] = str(conf)
    env["PATH"] = env.get("PATH", "") + ":/usr/sbin"
    log = (root / "log" / "daemons.out").open("wb")
    argvs = [
        ["munged", "-F", "--force", f"--key-file={key}", f"--socket={root}/munge/socket",
         f"--pid-file={root}/munge/pid", f"--seed-file={root}/munge/seed",
         f"--log-file={root}/log/munged.log"],
        ["slurmctld", "-D", "-f", str(conf)],
        *(["slurmd", "-D", "-f", str(conf), "-N", n] for n in NODES),
    ]  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    cluster = Slurm(root, env)
    failed = _boot(cluster, argvs, procs, log)
    if failed:
        _stop(procs)
        log.close()
        pytest.skip(f"SLURM did not come up here ({failed}):\n{cluster.logs()}")
    try:
        yield cluster
    finally:
        # no job may outlive the cluster: cancel, then wait for every job to be over
        cluster.cmd("scancel", "--full", "--user", "root", check=False)
        wait_until(lambda: not cluster.cmd("squeue", "-h", "-t", "R,CG,S", check=False).strip(), 30,
                   "every job to end", interval=0.2)  # fmt: skip
        _stop(procs)
        log.close()
        assert not any(alive(p.pid) for p in procs)


def _submit(
    slurm: Slurm, tmp: Path, mode: str, *, sbatch: tuple[str, ...] = (), ft: tuple[str, ...] = (),
    job: tuple[str, ...] = (), **env: str,
) -> str:  # fmt: skip
    job_env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    job_env.update(
        SLURM_CONF=slurm.env["SLURM_CONF"],
        PATH=slurm.env["PATH"],
        FAULT_TOL_FINISHED_FLAG_FILE=str(tmp / "finished"),
        FT_SUPERVISOR=str(Path(sys.executable).parent / "ft-supervisor"),
        **env,
    )
    argv = ["sbatch", "--parsable", "--chdir", str(tmp), "--output", str(tmp / "job.out"), *sbatch,
            str(RECIPE), "--preload", "none", "--log-dir", str(tmp / "logs"), "--save-timeout", "10", *ft,
            JOB, "--dir", str(tmp), "--mode", mode, *job]  # fmt: skip
    r = subprocess.run(argv, env=job_env, capture_output=True, text=True, timeout=20, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def _ended(slurm: Slurm, job_id: str, tmp: Path, timeout: float = 30) -> dict[str, str]:
    def over() -> dict[str, str] | None:
        job = slurm.job(job_id)
        return job if job["JobState"] in ("COMPLETED", "FAILED", "CANCELLED") else None

    try:
        return wait_until(over, timeout, f"job {job_id} to end", interval=0.1)  # type: ignore[no-any-return]
    except AssertionError:
        out = tmp / "job.out"
        raise AssertionError(f"{slurm.job(job_id)}\n{out.read_text() if out.exists() else ''}") from None


def _runs(tmp: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp / "runs.jsonl").read_text().splitlines()]


def test_an_abort_ends_the_job_without_a_requeue(slurm: Slurm, tmp_path: Path) -> None:
    job_id = _submit(slurm, tmp_path, "abort")
    job = _ended(slurm, job_id, tmp_path)
    assert (job["JobState"], job["ExitCode"], job["Restarts"]) == ("FAILED", "2:0", "0"), job
    assert job["ExcNodeList"] == "(null)"
    assert len(_runs(tmp_path)) == 1 and not (tmp_path / "finished").exists()
    assert "abort (exit 2)" in (tmp_path / "job.out").read_text()


def test_a_reschedule_requeues_the_job_off_the_node_and_it_resumes(slurm: Slurm, tmp_path: Path) -> None:
    job_id = _submit(slurm, tmp_path, "reschedule")
    job = _requeued(slurm, job_id)
    (first,) = _runs(tmp_path)
    assert job["ExcNodeList"] == first["node"]
    # SLURM makes a requeued job wait (EligibleTime: 120 s on 22.05); the test does not:
    # once the old run is gone, it makes the job eligible now. That changes only when.
    wait_until(lambda: not slurm.cmd("squeue", "-h", "-j", job_id, "-t", "CG").strip(), 30,
               "the first run to finish completing", interval=0.1)  # fmt: skip
    slurm.cmd("scontrol", "update", f"JobId={job_id}", "StartTime=now")
    job = _ended(slurm, job_id, tmp_path)
    assert (job["JobState"], job["ExitCode"], job["Restarts"]) == ("COMPLETED", "0:0", "1"), job
    first, second = _runs(tmp_path)
    assert (first["restart"], first["resumed_from"]) == (0, 0)
    # the requeued run: on the other node, from the checkpoint the first one left
    assert second["node"] != first["node"] and second["node"] in NODES
    assert (second["restart"], second["resumed_from"]) == (1, 3)
    assert json.loads((tmp_path / "ckpt.0.json").read_text())["step"] == 6
    # and a success ends the job: the finished flag, no further requeue
    assert (tmp_path / "finished").exists()
    out = (tmp_path / "job.out").read_text()
    assert f"requeued without node(s) {first['node']}" in out and "auto-resume: training finished" in out


def _requeued(slurm: Slurm, job_id: str) -> dict[str, str]:
    def pending_again() -> dict[str, str] | None:
        job = slurm.job(job_id)
        return job if job["Restarts"] == "1" and job["JobState"] == "PENDING" else None

    return wait_until(pending_again, 30, "the job to be requeued", interval=0.1)  # type: ignore[no-any-return]


def _gasp(slurm: Slurm, job_id: str, tmp: Path, signame: str) -> dict[str, Any]:
    wait_until(lambda: list(tmp.glob("running.*.0")), 30, "the rank to step", interval=0.05)
    # what --signal=B:USR1@120 does before the time limit: a signal to the batch shell only
    slurm.cmd("scancel", "--batch", f"--signal={signame}", job_id)
    (gasp,) = wait_until(lambda: list(tmp.glob("gasp.*.0.json")), 30, "the dying-gasp save")
    return json.loads(gasp.read_text())  # type: ignore[no-any-return]


def test_the_time_limit_warning_gets_the_dying_gasp_save_and_a_requeue(slurm: Slurm, tmp_path: Path) -> None:
    job_id = _submit(slurm, tmp_path, "run")
    saved = _gasp(slurm, job_id, tmp_path, "USR1")
    assert saved["step"] > 0 and "SIGTERM" in saved["reason"], saved
    # requeued as it is (no node to avoid), and not counted as a failure
    job = _requeued(slurm, job_id)
    assert job["ExcNodeList"] == "(null)"
    assert not (tmp_path / "finished.failures").exists()
    slurm.cmd("scancel", job_id)
    _ended(slurm, job_id, tmp_path)
    out = (tmp_path / "job.out").read_text()
    assert "the time limit is near (SIGUSR1): the ranks saved; requeueing" in out


def test_scancel_with_sigterm_saves_and_ends_the_job(slurm: Slurm, tmp_path: Path) -> None:
    job_id = _submit(slurm, tmp_path, "run")
    saved = _gasp(slurm, job_id, tmp_path, "TERM")
    assert saved["step"] > 0 and "SIGTERM" in saved["reason"], saved
    job = _ended(slurm, job_id, tmp_path)
    assert (job["JobState"], job["ExitCode"], job["Restarts"]) == ("FAILED", "143:0", "0"), job
    assert "stopped by SIGTERM (exit 143); the job ends" in (tmp_path / "job.out").read_text()


@pytest.mark.torch
def test_one_node_rescheduled_stops_the_others_and_requeues_the_job_without_it(
    slurm: Slurm, endpoint: str, tmp_path: Path
) -> None:
    # two daemons, one per node, at a store the test hosts (RDZV_ENDPOINT): on one host
    # either could otherwise host it, and the node that leaves would take it along
    rdzv = ("--nproc-per-node", "1", "--local-addr", "127.0.0.1",
            "--rdzv-conf", "is_host=0,last_call_timeout=1,keep_alive_interval=1")  # fmt: skip
    job_id = _submit(slurm, tmp_path, "reschedule", sbatch=("--nodes", "2"), ft=rdzv,
                     job=("--ask-node", "n2"), RDZV_ENDPOINT=endpoint)  # fmt: skip
    # n2 leaves (200); n1 would wait join_timeout (600 s) for a replacement: it is stopped
    # at once instead, its rank saves, and the job goes back to the queue without n2
    job = _requeued(slurm, job_id)
    assert job["ExcNodeList"] == "n2"
    codes = {f.name: f.read_text().strip() for f in (tmp_path / "finished.codes").glob("code.*")}
    assert codes == {"code.n1": "143", "code.n2": "200"}
    assert list(tmp_path.glob("gasp.n1.*.json"))
    out = (tmp_path / "job.out").read_text()
    assert "node n1: stopping (code.n2:200)" in out and "requeued without node(s) n2" in out
    # two nodes cannot be had without n2 here: the requeued job waits; end it
    slurm.cmd("scancel", job_id)
    _ended(slurm, job_id, tmp_path)
