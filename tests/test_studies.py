"""The pre-registered studies' analyses (dev/studies/*/analyze.py) on raw data written here by hand: they refuse
to report before every registered run is packed, and their per-arm means, SEs and paired tests are the ones
computed here from the same numbers. The pipelines themselves (run.py) are run at toy size by hand, never in
the suite (they train models)."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

REPO = Path(__file__).resolve().parents[1]
STUDIES = REPO / "dev" / "studies"


def analyze(study: str, raw: Path, out: Path):
    return subprocess.run([sys.executable, str(STUDIES / study / "analyze.py"), "--raw", str(raw), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def protocol(study: str) -> dict:
    return json.loads((STUDIES / study / "protocol.json").read_text())


def paired(a, b):
    d = np.array(a) - np.array(b)
    t = stats.ttest_1samp(d, 0.0)
    return d.mean(), d.std(ddof=1) / np.sqrt(len(d)), t.pvalue


def write_distill_arm(raw: Path, arm: str, seed: int, hard: float, easy: float | None) -> None:
    folder = raw / f"{arm}_s{seed}"
    folder.mkdir(parents=True)
    ev = {"hard": {"mean_acc": hard, "pass@32": min(1.0, 2 * hard), "samples": 32}}
    if easy is not None:
        ev["easy"] = {"mean_acc": easy, "pass@8": 1.0, "samples": 8}
    (folder / "eval.json").write_text(json.dumps(ev))
    (folder / "summary.json").write_text("{}")


def test_coach_distill_analysis(tmp_path):
    proto = protocol("coach_distill")
    seeds, arms = proto["seeds"], list(proto["arms"])
    rng = np.random.default_rng(0)
    hard = {a: {s: float(rng.uniform(0, 0.6)) for s in seeds} for a in arms}
    easy = {a: {s: float(rng.uniform(0.5, 0.9)) for s in seeds} for a in arms}
    raw = tmp_path / "raw"
    for a in arms:
        for s in seeds[:-1]:
            write_distill_arm(raw, a, s, hard[a][s], None if a == "ceiling" else easy[a][s])
    proc = analyze("coach_distill", raw, tmp_path / "r.json")
    assert proc.returncode != 0 and "no interim looks" in proc.stderr and not (tmp_path / "r.json").exists()

    for a in arms:
        write_distill_arm(raw, a, seeds[-1], hard[a][seeds[-1]], None if a == "ceiling" else easy[a][seeds[-1]])
    proc = analyze("coach_distill", raw, tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    a, b = proto["primary"]["comparison"]
    mean, se, p = paired([hard[a][s] for s in seeds], [hard[b][s] for s in seeds])
    assert res["primary"]["mean"] == pytest.approx(mean) and res["primary"]["se"] == pytest.approx(se)
    assert res["primary"]["p"] == pytest.approx(p) and res["primary"]["passes"] == (p < 0.05 and mean > 0)
    row = res["arms"]["sft"]["hard_mean_acc"]
    assert row["mean"] == pytest.approx(np.mean(list(hard["sft"].values())))
    assert row["se"] == pytest.approx(np.std(list(hard["sft"].values()), ddof=1) / np.sqrt(len(seeds)))
    forgetting = res["arms"]["rl"]["forgetting"]
    assert forgetting["mean"] == pytest.approx(np.mean([easy["rl"][s] - easy["untrained"][s] for s in seeds]))
    assert "forgetting" not in res["arms"]["ceiling"] and "forgetting" not in res["arms"]["untrained"]
    vs = res["against_baseline"]["pq"]
    assert vs["baseline"] == "rl" and vs["mean"] == pytest.approx(paired([hard["pq"][s] for s in seeds],
                                                                          [hard["rl"][s] for s in seeds])[0])
    ps = sorted(v["hard_mean_acc"]["p"] for v in res["secondary"].values())
    holm = sorted(v["hard_mean_acc"]["p_holm"] for v in res["secondary"].values())
    assert holm[0] == pytest.approx(min(1.0, len(ps) * ps[0])) and all(h >= p for h, p in zip(holm, ps))


def write_band_arm(raw: Path, arm: str, seed: int, start: float, end: float, readout: int) -> None:
    folder = raw / f"{arm}_s{seed}"
    folder.mkdir(parents=True)
    rows = [{"step": 0, "eval/accuracy": start}, {"step": readout // 2, "eval/accuracy": (start + end) / 2},
            {"step": readout, "eval/accuracy": end}]
    for r in rows:  # the held-out mixed problems: twice the gain of the whole held-out set
        r["eval/accuracy/band/mixed"] = 2 * r["eval/accuracy"]
    with gzip.open(folder / "metrics.jsonl.gz", "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "bands_summary.json").write_text(json.dumps({"band_files": {n: {"problems": 10} for n in
                                                                          ("all_zero", "mixed", "all_one", "heldout")}}))
    (folder / "summary.json").write_text(json.dumps({"train_problems": 10 if arm != "all" else 30}))


def test_band_rl_analysis(tmp_path):
    proto = protocol("band_rl")
    seeds, arms, step = proto["seeds"], list(proto["arms"]), proto["readout_step"]
    rng = np.random.default_rng(1)
    start = {s: float(rng.uniform(0.1, 0.3)) for s in seeds}
    end = {a: {s: start[s] + float(rng.uniform(0, 0.2)) for s in seeds} for a in arms}
    raw = tmp_path / "raw"
    for a in arms:
        for s in seeds:
            if (a, s) != ("random", seeds[0]):
                write_band_arm(raw, a, s, start[s], end[a][s], step)
    proc = analyze("band_rl", raw, tmp_path / "r.json")
    assert proc.returncode != 0 and "no interim looks" in proc.stderr

    write_band_arm(raw, "random", seeds[0], start[seeds[0]], end["random"][seeds[0]], step)
    proc = analyze("band_rl", raw, tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    mean, se, p = paired([end["mixed"][s] for s in seeds], [end["random"][s] for s in seeds])
    assert (res["primary"]["mean"], res["primary"]["se"], res["primary"]["p"]) == pytest.approx((mean, se, p))
    assert res["arms"]["all"]["gain"]["mean"] == pytest.approx(np.mean([end["all"][s] - start[s] for s in seeds]))
    assert res["arms"]["all"]["train_problems"]["mean"] == 30
    assert res["arms"]["mixed"]["gain_by_band"]["mixed"]["mean"] == pytest.approx(
        2 * np.mean([end["mixed"][s] - start[s] for s in seeds]))

    write_band_arm(tmp_path / "short", "mixed", seeds[0], 0.1, 0.2, step - 10)  # no evaluation at the read-out step
    for a in arms:
        for s in seeds:
            if not (tmp_path / "short" / f"{a}_s{s}").exists():
                write_band_arm(tmp_path / "short", a, s, 0.1, 0.2, step)
    proc = analyze("band_rl", tmp_path / "short", tmp_path / "r2.json")
    assert proc.returncode != 0 and "read-out step" in proc.stderr


def test_queue_stages_name_scripts_and_fixed_commits():
    """dev/queue.json: every stage's script exists, its commit is a full sha (literal or a FROZEN_COMMIT file) that
    this clone holds, and every registered study is queued."""
    stages = json.loads((REPO / "dev" / "queue.json").read_text())["stages"]
    studies = {p.parent.name for p in STUDIES.glob("*/protocol.json")}
    assert studies <= {s["name"] for s in stages} and len({s["name"] for s in stages}) == len(stages)
    shallow = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--is-shallow-repository"], capture_output=True,
                             text=True)
    has_history = shallow.returncode == 0 and shallow.stdout.strip() == "false"  # a shallow or no clone: names only
    for stage in stages:
        assert (REPO / stage["command"].split()[0]).is_file(), stage["name"]
        spec = stage["commit"]
        sha = (REPO / spec.removeprefix("file:")).read_text().strip() if spec.startswith("file:") else spec
        assert len(sha) == 40 and int(sha, 16) >= 0, stage["name"]
        if has_history:
            found = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{sha}^{{commit}}"], capture_output=True)
            assert found.returncode == 0, f"{stage['name']}: {sha} is not a commit of this clone"
