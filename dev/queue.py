"""The project's registered long runs, in order, one owner of the cores at a time. Start it first thing in
every session (it resumes wherever the last one stopped), and nothing heavy beside it:

    echo 0 > /proc/sys/kernel/sched_autogroup_enabled        # nice values then hold across sessions
    (setsid nohup nice -n 5 python dev/queue.py >> /work/queue.log 2>&1 &)
    python dev/queue.py --status                              # each stage's own --status: counts, never numbers

``dev/queue.json`` lists the stages: each one's command (every stage is resumable and skips what is already
packed in the repository), the fixed commit its code runs from (a literal sha, or a ``FROZEN_COMMIT`` file),
and the worktree that holds that commit, made here when missing. A stage runs until its command exits 0;
one that fails is logged and the queue goes on to the next, so the cores stay busy while someone looks.
While another process already runs a stage's script (say a confirmation started by hand), the queue waits
for it to end before it runs that stage itself. Packing, committing and analysing stay with people.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = Path(__file__).with_name("queue.json")
AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")


def commit_of(stage: dict) -> str:
    spec = stage["commit"]
    return (REPO / spec.removeprefix("file:")).read_text().strip() if spec.startswith("file:") else spec


def worktree(stage: dict, work: Path) -> Path:
    """The stage's worktree at its commit: made if missing, refused if it holds another commit."""
    path, want = work / stage["worktree"], commit_of(stage)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), want], check=True,
                       stdout=subprocess.DEVNULL)
    head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if head != want:
        raise SystemExit(f"{path} is at {head or 'no commit'}, not {stage['name']}'s {want}")
    return path


def command(stage: dict, work: Path, code: Path | None, status: bool = False) -> list[str]:
    text = stage["command"].format(code=code or "", work=work)
    return [sys.executable, *shlex.split(text), *(["--status"] if status else [])]


def others_running(stage: dict) -> bool:
    """Whether a process outside this queue runs the stage's script (``--status`` calls aside)."""
    script = shlex.split(stage["command"])[0]
    found = subprocess.run(["pgrep", "-af", script], capture_output=True, text=True).stdout.splitlines()
    return any("--status" not in line and "dev/queue.py" not in line for line in found)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/work", help="where worktrees and run folders go")
    ap.add_argument("--status", action="store_true", help="each stage's own --status")
    ap.add_argument("--only", nargs="*", help="these stages alone, in queue order")
    args = ap.parse_args()
    work = Path(args.work).resolve()
    stages = [s for s in json.loads(STAGES.read_text())["stages"] if not args.only or s["name"] in args.only]
    if args.status:
        for stage in stages:
            res = subprocess.run(command(stage, work, work / stage["worktree"], status=True), cwd=REPO,
                                 capture_output=True, text=True)
            print(f"{stage['name']:>14} (issue {stage['issue']}): {(res.stdout or res.stderr).strip().splitlines()[-1:]}")
        return
    if AUTOGROUP.exists() and AUTOGROUP.read_text().strip() == "1":
        raise SystemExit(f"{AUTOGROUP} is 1: every session gets an equal share of the cores whatever its nice value; "
                         f"`echo 0 > {AUTOGROUP}` first")
    lock = open(work / "queue.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(f"another queue holds {work / 'queue.lock'}") from None
    for stage in stages:
        if others_running(stage):
            print(f"{time.strftime('%F %T')} {stage['name']}: its script runs elsewhere; waiting for it to end", flush=True)
        while others_running(stage):
            time.sleep(60)
        code, t0 = worktree(stage, work), time.perf_counter()
        print(f"{time.strftime('%F %T')} start {stage['name']} (issue {stage['issue']}) from {code}", flush=True)
        rc = subprocess.run(command(stage, work, code), cwd=REPO).returncode
        print(f"{time.strftime('%F %T')} {stage['name']} {'done' if rc == 0 else f'FAILED (rc {rc})'} "
              f"in {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"{time.strftime('%F %T')} queue finished", flush=True)


if __name__ == "__main__":
    main()
