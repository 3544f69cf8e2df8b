"""A real two-node SLURM cluster on this one host, for ``tests/test_slurm.py`` (fixture ``slurm_cluster``).

Debian's ``slurmctld``/``slurmd`` (``bash scripts/install.sh cpu test-slurm`` installs them with apt; the
tests never install anything: without them they skip, saying why, or fail where
``SOAR_REQUIRE_SLURM=1``, as ``.ci/run`` sets it) run by hand, without systemd or munge: ``AuthType=auth/none``,
``CredType=cred/none``, ``ProctrackType=proctrack/cgroup`` (cgroup v1; with ``proctrack/pgid``
setsid'd Ray daemons outlive their job; ``proctrack/linuxproc`` where v1 is missing, or as
``SOAR_SLURM_PROCTRACK`` says), and two ``slurmd -N nodeN`` on their own ports (Debian
builds with MULTIPLE_SLURMD), so a job can span two "nodes". Everything lives under one temp
folder; ``SLURM_CONF`` is exported for the test process and its children. Teardown cancels the jobs
first (a slurmd stopped under a running job leaves a ``slurmstepd`` behind), then stops the daemons.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGES = ["slurmctld", "slurmd", "slurm-client"]
NODES = ("node1", "node2")
CPUS_PER_NODE = 2
"""Each "node" advertises 2 CPUs (the host's cores, shared): 4 one-CPU jobs fit at once."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_missing() -> str | None:
    """None when slurmctld, slurmd and sbatch are installed, else why the SLURM tests cannot run."""
    missing = [b for b in ("slurmctld", "slurmd", "sbatch") if not (shutil.which(b) or Path(f"/usr/sbin/{b}").exists())]
    if not missing:
        return None
    return (f"SLURM is not installed ({', '.join(missing)} not found); `bash scripts/install.sh cpu test-slurm` "
            f"installs Debian's {' '.join(PACKAGES)} with apt (as root)")


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    env: dict
    procs: list = field(default_factory=list)
    bringup_s: float = 0.0

    def run(self, *args, check=True, timeout=60) -> subprocess.CompletedProcess:
        res = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, args))} failed ({res.returncode}): {res.stdout}{res.stderr}")
        return res

    def sbatch(self, *args) -> str:
        """Submit; returns the job id."""
        return self.run("sbatch", "--parsable", *map(str, args)).stdout.strip().split(";")[0]

    def job_state(self, job_id: str) -> str:
        """squeue's state while the job is known to slurmctld (``MinJobAge`` keeps it a while after
        it ends), else ``GONE``."""
        res = self.run("squeue", "-h", "-j", str(job_id), "-o", "%T", check=False)
        if res.returncode != 0 or not res.stdout.strip():
            res = self.run("scontrol", "show", "job", str(job_id), check=False)
            for tok in res.stdout.split():
                if tok.startswith("JobState="):
                    return tok.split("=", 1)[1]
            return "GONE"
        return res.stdout.strip().splitlines()[0]

    def wait_job(self, job_id: str, timeout: float, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                                             "NODE_FAIL", "OUT_OF_MEMORY", "GONE")) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            state = self.job_state(job_id)
            if state in states:
                return state
            time.sleep(0.5)
        raise TimeoutError(f"job {job_id} still {self.job_state(job_id)} after {timeout} s\n{self.logs()}")

    def nodes_idle(self) -> bool:
        res = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        states = dict(line.split() for line in res.stdout.splitlines() if line.strip())
        return res.returncode == 0 and all(states.get(n) == "idle" for n in NODES)

    def logs(self) -> str:
        out = []
        for log in sorted((self.root / "log").glob("*.log")):
            out.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:]))
        return "\n".join(out)

    def cancel_all(self) -> None:
        self.run("scancel", "--full", "-u", os.environ.get("USER", "root"), check=False)
        deadline = time.time() + 30
        while time.time() < deadline:
            if not self.run("squeue", "-h", "-o", "%i", check=False).stdout.strip():
                return
            time.sleep(0.5)

    def stop(self) -> None:
        self.cancel_all()
        for proc in reversed(self.procs):  # slurmds first, then slurmctld
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def proctrack() -> str:
    """``proctrack/cgroup`` on cgroup v1 (writable freezer hierarchy, as here); Slurm 22.05's cgroup v2
    plugin needs systemd, so elsewhere ``proctrack/linuxproc`` (tracks the process tree by parent
    pid: Ray's daemons, children of ``ray start``, are still found; ``proctrack/pgid`` would miss them)."""
    if os.environ.get("SOAR_SLURM_PROCTRACK"):
        return os.environ["SOAR_SLURM_PROCTRACK"]
    freezer = Path("/sys/fs/cgroup/freezer")
    return "proctrack/cgroup" if freezer.is_dir() and os.access(freezer, os.W_OK) else "proctrack/linuxproc"


def write_config(root: Path, hostname: str) -> Path:
    etc, state, log, spool = (root / d for d in ("etc", "state", "log", "spool"))
    for d in (etc, state, log, spool):
        d.mkdir(parents=True, exist_ok=True)
    ctld_port = _free_port()
    node_lines = []
    for node in NODES:
        (spool / node).mkdir(exist_ok=True)
        node_lines.append(f"NodeName={node} NodeHostname={hostname} NodeAddr=127.0.0.1 Port={_free_port()} "
                          f"CPUs={CPUS_PER_NODE} RealMemory=4000 State=UNKNOWN")
    conf = etc / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=soartest",
        f"SlurmctldHost={hostname}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "AuthType=auth/none",
        "CredType=cred/none",
        "AuthInfo=cred_expire=10",  # a requeued job waits this long before it is eligible (default 120 s)
        "SlurmUser=root",
        "SlurmdUser=root",
        f"ProctrackType={proctrack()}",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=1",
        "MpiDefault=none",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",
        "JobRequeue=1",
        "MinJobAge=300",
        "KillWait=20",
        "InactiveLimit=0",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        f"StateSaveLocation={state}",
        f"SlurmdSpoolDir={spool}/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={log}/slurmctld.log",
        f"SlurmdLogFile={log}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        *node_lines,
        f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP",
        "",
    ]))
    (etc / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nConstrainCores=no\nConstrainRAMSpace=no\n")
    return conf


def start_cluster(root: Path, timeout: float = 60) -> SlurmCluster:
    t0 = time.perf_counter()
    hostname = socket.gethostname()
    conf = write_config(root, hostname)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(root, conf, env)
    sbin = "/usr/sbin"

    def daemon(*args):
        log = open(root / "log" / f"{Path(args[0]).name}{'-' + args[-1] if '-N' in args else ''}.out", "w")
        proc = subprocess.Popen(list(args), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        cluster.procs.append(proc)

    daemon(f"{sbin}/slurmctld", "-D", "-i", "-f", str(conf))  # -i: ignore state from a previous run
    for node in NODES:
        daemon(f"{sbin}/slurmd", "-D", "-f", str(conf), "-N", node)
    deadline = time.time() + timeout
    while not cluster.nodes_idle():
        dead = [p.args for p in cluster.procs if p.poll() is not None]
        if dead or time.time() > deadline:
            cluster.stop()
            outs = "\n".join(p.read_text()[-2000:] for p in (root / "log").glob("*.out"))
            raise RuntimeError(f"SLURM did not come up ({'exited: ' + str(dead) if dead else 'timeout'})\n"
                               f"{cluster.logs()}\n" + outs)
        time.sleep(0.3)
    cluster.bringup_s = time.perf_counter() - t0
    return cluster


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A running two-node SLURM cluster; ``SLURM_CONF`` is set in ``os.environ`` while it lives."""
    why = slurm_missing()
    if why and os.environ.get("SOAR_REQUIRE_SLURM") == "1":
        pytest.fail(f"SOAR_REQUIRE_SLURM=1 but {why}")
    if why:
        pytest.skip(why)
    # A short root: slurmd's spool/socket paths must stay under the UNIX socket path limit.
    root = Path(f"/tmp/soar-slurm-{os.getpid()}")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    cluster = start_cluster(root)
    print(f"SLURM: daemons to idle nodes {cluster.bringup_s:.1f} s ({proctrack()})")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        cluster.stop()
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        shutil.rmtree(root, ignore_errors=True)
