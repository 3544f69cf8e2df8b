"""Rebuild, from committed data alone, every figure issue 50 quotes about the gates run before the
confirmation, with the seed as the unit (``soar.stats``). Writes ``dev/results/gates_recomputed.json``.

    python dev/scripts/recompute_gates.py

Reads ``dev/results/raw/<gate>/`` (``dev/scripts/pack_past_gates.py``: each run's gzipped
``metrics.jsonl``, ``promotions.jsonl``, ``pq.jsonl``, ``config.yaml``; fresh students' ``eval.json``)
and, for the gates older than the tarballs (2026-12-01 to 12-03), the per-step rewards that their
``dev/results/world_gate_*.json`` hold (``runs.<run>.rewards``: the same ``teacher/reward_mean`` series).
Where a gate has both, the two are checked against each other (``raw_matches_committed``).
The paired reading reads the committed ``after_promotion_paired_horizon200_s{3,4,5}.json`` (students
retrained from the promoted checkpoints, which are not committed), and the old rule's false-positive
rate ``gate_rule_fpr.json`` (``dev/scripts/gate_rule_fpr.py``).

Figures: the gate records tried before the current preset and how many distinct configurations they
are, which passed the old rule (a majority of seeds ahead and the step-level z > 2) and whether any
passes the seed-level test; the preset's gate (seeds 3-5) with the seed as the unit; the failed
(τ = 0.02, fading cosine) against the passing preset (T = 200) on the same seeds; the rerun noise of
Base-T on seeds 3-5; fresh students by teacher seed (SOAR-PQ - Base-T PQ, PQ - Hard-Only; slope rule
and fixed step); the paired reading over seeds.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # soar.stats, installed or not

from soar.stats import last_third, mean_se, paired_t, step_z, wilcoxon  # noqa: E402

RESULTS = REPO / "dev" / "results"
RAW = RESULTS / "raw"

# Every gate record before the current preset, in the order tried. ``config`` groups records that ran
# the same configuration (the same preset of the day and the same overrides) on other seeds or for more
# steps; ``source`` is a raw folder (``raw:<gate>``) or a committed world_gate file's runs.
RECORDS = [
    {"record": "arith", "config": "g4x32_T1_gold_logprob_tau1", "source": "world_gate_arith.json",
     "what": "the preset of 2026-12-01 (g = 4 x 32, T = 1, rewards in gold log-probability, tau = 1 nat)"},
    {"record": "arith_tau9", "config": "g4x32_tau9", "source": "world_gate_arith_tau9.json",
     "what": "the same, tau = 9 nats"},
    {"record": "arith_tau8.3", "config": "g4x32_tau8.3", "source": "world_gate_arith_tau8.3.json",
     "what": "the same, tau = 8.3 nats"},
    {"record": "arith_g8n8", "config": "g8n8_tau0.01", "source": "world_gate_arith_g8n8.json",
     "what": "the preset of 2026-12-02 (g = 8 x 8, T = 0.7, gold_prob, tau = 0.01)"},
    {"record": "arith_teacher13_pilot", "config": "g8n8_teacher13", "source": "world_gate_arith_teacher13_pilot.json",
     "what": "that preset in a world whose teacher role is pretrained on 0-12 carries"},
    {"record": "arith_tau0.05_pilot", "config": "g8n8_tau0.05", "source": "world_gate_arith_tau0.05_pilot.json",
     "what": "that preset, tau = 0.05"},
    {"record": "arith_g16_tau0.05_pilot", "config": "g16_tau0.05", "source": "world_gate_arith_g16_tau0.05_pilot.json",
     "what": "g = 16 x 8, tau = 0.05"},
    {"record": "arith_g16_kl0.001_pilots:lora", "config": "g16_tau0.05_kl0.001_lora",
     "source": "world_gate_arith_g16_kl0.001_pilots.json", "what": "+ teacher KL 0.001, LoRA r 16 at lr 3e-4 (seed 0)"},
    {"record": "arith_g16_kl0.001_pilots:fullkl", "config": "g16_tau0.05_kl0.001_full",
     "source": "world_gate_arith_g16_kl0.001_pilots.json", "what": "+ teacher KL 0.001, full fine-tuning (seed 0)"},
    {"record": "arith_g16_kl0.001_s12", "config": "g16_tau0.05_kl0.001_lora", "source": "raw:arith_g16_kl0.001_s12",
     "what": "the LoRA teacher, seeds 1-2"},
    {"record": "arith_g16_kl0.001_slr5e-5_pilot", "config": "g16_tau0.05_kl0.001_lora_slr5e-5",
     "source": "world_gate_arith_g16_kl0.001_slr5e-5_pilot.json", "what": "+ students at lr 5e-5 (seed 0, 31 / 33 steps)"},
    {"record": "arith_g16_kl0.001_slr5e-5_s0_80steps", "config": "g16_tau0.05_kl0.001_lora_slr5e-5",
     "source": "raw:arith_g16_kl0.001_slr5e-5_s0_80steps", "what": "the same run continued (47 / 49 steps)"},
    {"record": "arith_g16_kl0.001_lorastudent_pilot", "config": "g16_tau0.05_kl0.001_lora_lorastudents",
     "source": "raw:arith_g16_kl0.001_lorastudent_pilot", "what": "+ LoRA students r 16 at lr 1e-3 (seed 0)"},
    {"record": "arith_g16_kl0.001_tau0.01", "config": "lora_tau0.01", "source": "raw:arith_g16_kl0.001_tau0.01",
     "what": "the LoRA teacher at tau = 0.01"},
    {"record": "arith_g16_kl0.001_tau0.01_slr3e-5", "config": "lora_tau0.01_slr3e-5",
     "source": "raw:arith_g16_kl0.001_tau0.01_slr3e-5", "what": "+ students at lr 3e-5"},
    {"record": "arith_g16_kl0.001_tau0.02_slr3e-5", "config": "lora_tau0.02_slr3e-5",
     "source": "raw:arith_g16_kl0.001_tau0.02_slr3e-5", "what": "tau = 0.02: the preset of 2026-12-04, seeds 0-2"},
    {"record": "arith_g16_kl0.001_tau0.02_slr3e-5_fresh_s345", "config": "lora_tau0.02_slr3e-5",
     "source": "raw:arith_g16_kl0.001_tau0.02_slr3e-5_fresh_s345", "what": "the same preset, fresh seeds 3-5"},
    {"record": "arith_r2", "config": "lora_tau0.02_slr3e-5_r2", "source": "raw:arith_r2",
     "what": "that preset with r = 2 students per dataset (seed 3; seed 4 stopped at 27 / 32 steps); no world_gate file"},
]
FRESH_COMPARISONS = [("SOAR-PQ", "Base-T PQ"), ("SOAR-PQ", "Hard-Only"), ("Base-T PQ", "Hard-Only"),
                     ("SOAR-PS", "Base-T PS")]
PRESET = {"record": "arith_horizon200", "config": "lora_tau0.02_slr3e-5_T200", "source": "raw:arith_horizon200",
          "what": "the current preset (teacher.max_steps 200), seeds 3-5"}


def read_jsonl_gz(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def raw_runs(gate: str) -> dict[str, dict]:
    """Per run of a packed gate: its step rewards and promotion steps."""
    out = {}
    for run in sorted((RAW / gate).iterdir()):
        if (run / "metrics.jsonl.gz").exists():
            out[run.name] = {"rewards": [r["teacher/reward_mean"] for r in read_jsonl_gz(run / "metrics.jsonl.gz")],
                             "promotions": [p["step"] for p in read_jsonl_gz(run / "promotions.jsonl.gz")]}
    return out


def committed_runs(file: str, record: str) -> dict[str, dict]:
    """Per run, the step rewards a committed world_gate file holds (the pilots file: one Grounded-T run per
    variant against a recorded Base-T; the teacher13 file: its loop pilot)."""
    d = json.loads((RESULTS / file).read_text())
    if ":" in record:  # world_gate_arith_g16_kl0.001_pilots.json
        run = d["runs"][record.split(":")[1]]
        return {"grounded_s0": {"rewards": run["rewards"], "promotions": [p["step"] for p in run["promotion_records"]]},
                "base_s0": {"rewards": d["base_rewards"], "promotions": []}}
    runs = d.get("loop_pilot", d)["runs"]
    return {name: {"rewards": r["rewards"], "promotions": [p["step"] for p in r.get("promotion_records", [])]}
            for name, r in runs.items()}


def runs_of(rec: dict) -> dict[str, dict]:
    return raw_runs(rec["source"][4:]) if rec["source"].startswith("raw:") else committed_runs(rec["source"], rec["record"])


def pairs(runs: dict) -> dict[int, tuple[list, list]]:
    """Per seed with both runs: Grounded-T's and Base-T's rewards over the steps both have."""
    out = {}
    for name in runs:
        if name.startswith("grounded_s") and name[len("grounded_s"):].isdigit():
            s = int(name[len("grounded_s"):])
            if f"base_s{s}" in runs:
                gt, bt = runs[name]["rewards"], runs[f"base_s{s}"]["rewards"]
                n = min(len(gt), len(bt))
                out[s] = (gt[:n], bt[:n])
    return dict(sorted(out.items()))


def gate_reading(runs: dict) -> dict:
    """The gate with the seed as the unit (one-sided paired t, the pass rule of dev/confirm/PROTOCOL.md, and
    two-sided p), Wilcoxon, and beside them the step-level z and the old rule it fed."""
    per_seed, by_step = {}, []
    for s, (gt, bt) in pairs(runs).items():
        gt_l, bt_l = last_third(gt), last_third(bt)
        per_seed[s] = {"grounded": float(np.mean(gt_l)), "base": float(np.mean(bt_l)),
                       "difference": float(np.mean(gt_l) - np.mean(bt_l)), "steps": len(gt),
                       "promotions": [runs[f"grounded_s{s}"]["promotions"], runs[f"base_s{s}"]["promotions"]]}
        by_step.append([a - b for a, b in zip(gt_l, bt_l)])
    diffs = [v["difference"] for v in per_seed.values()]
    one, two, z = paired_t(diffs, "greater"), paired_t(diffs), step_z(by_step)
    wins = sum(d > 0 for d in diffs)
    return {"per_seed": per_seed, "seeds": len(diffs), "paired_t_one_sided": one, "p_two_sided": two["p"],
            "wilcoxon_one_sided": wilcoxon(diffs, "greater"), "step_level_z_not_independent": z,
            "grounded_ahead": int(wins),
            "passes_seed_level_test": bool(one["p"] is not None and one["p"] < 0.05),
            "passes_old_rule": bool(wins * 3 >= 2 * len(diffs) and z["z"] is not None and z["z"] > 2)}


def raw_matches_committed(gate: str) -> dict | None:
    """The largest difference between a packed run's rewards and those its world_gate file holds."""
    path = RESULTS / f"world_gate_{gate}.json"
    if not path.exists():
        return None
    committed = json.loads(path.read_text())["runs"]
    raw = raw_runs(gate)
    gaps = {name: float(np.max(np.abs(np.subtract(raw[name]["rewards"][:len(r["rewards"])], r["rewards"]))))
            for name, r in committed.items() if name in raw and len(raw[name]["rewards"]) >= len(r["rewards"])}
    return {"runs_compared": len(gaps), "max_abs_difference": max(gaps.values()) if gaps else None,
            "runs_longer_in_raw": sorted(n for n, r in committed.items()
                                         if n in raw and len(raw[n]["rewards"]) > len(r["rewards"]))}


def last_third_means(gate: str, variant: str) -> dict[int, float]:
    return {s: float(np.mean(last_third(r["rewards"]))) for s, r in
            ((int(n.split("_s")[1]), r) for n, r in raw_runs(gate).items() if n.startswith(f"{variant}_s"))}


def fresh_by_teacher_seed(gate: str, key: str = "eval/pass@32") -> dict:
    """A gate's fresh students, per row and teacher seed (students k = seed * 100 + j, PS rows k = seed): the
    mean over the seed's students of each reading (slope rule ``selected``, ``fixed`` step, ``final``)."""
    rows: dict[str, dict[int, dict[str, list]]] = {}
    for d in sorted((RAW / gate / "fresh").iterdir()):
        if not (d / "eval.json.gz").exists():
            continue
        e = json.loads(gzip.open(d / "eval.json.gz", "rt").read())
        seed = e["seed"] if e["method"] in ("ps", "base", "teacher") else e["seed"] // 100
        if e["method"] == "base":
            continue
        per = rows.setdefault(e["label"], {}).setdefault(seed, {"selected": [], "fixed": [], "final": [], "students": []})
        for reading in ("selected", "fixed", "final"):
            per[reading].append(e.get(reading, e["selected"])[key])
        per["students"].append(e["seed"])
    return {label: {s: {k: (float(np.mean(v)) if k != "students" else v) for k, v in per.items()}
                    for s, per in sorted(seeds.items())} for label, seeds in rows.items()}


def compare_fresh(fresh: dict, a: str, b: str) -> dict:
    """Row a minus row b per teacher seed, each reading, paired t over seeds (two-sided)."""
    out = {}
    common = sorted(set(fresh[a]) & set(fresh[b]))
    for reading in ("selected", "fixed", "final"):
        d = {s: 100 * (fresh[a][s][reading] - fresh[b][s][reading]) for s in common}
        out[reading] = {"per_seed_points": d, "test": paired_t(list(d.values()))}
    return out


def student_level(gate: str, label: str, key: str = "eval/pass@32") -> list[float]:
    vals = []
    for d in sorted((RAW / gate / "fresh").iterdir()):
        if (d / "eval.json.gz").exists():
            e = json.loads(gzip.open(d / "eval.json.gz", "rt").read())
            if e["label"] == label:
                vals.append(100 * e["selected"][key])
    return vals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESULTS / "gates_recomputed.json"))
    args = ap.parse_args()
    report: dict = {"unit": "the seed (a teacher run pair); SE with ddof 1; paired t over seeds",
                    "sources": {"raw": "dev/results/raw (dev/scripts/pack_past_gates.py)",
                                "committed": "dev/results/world_gate_*.json runs' rewards, for gates older than "
                                             "the tarballs"}}

    # 1. the gate records before the current preset
    records = []
    for rec in RECORDS:
        runs = runs_of(rec)
        reading = gate_reading(runs)
        recorded = None
        if not rec["source"].startswith("raw:") and ":" not in rec["record"]:
            d = json.loads((RESULTS / rec["source"]).read_text())
            recorded = d.get("loop_pilot", d).get("passes_reward_gate")
        elif rec["source"].startswith("raw:") and (RESULTS / f"world_gate_{rec['record']}.json").exists():
            recorded = json.loads((RESULTS / f"world_gate_{rec['record']}.json").read_text())["passes_reward_gate"]
        records.append({**rec, **reading, "passes_old_rule_as_recorded": recorded})
    configs = sorted({r["config"] for r in records})
    passes = [r["record"] for r in records if r["passes_old_rule"]]
    report["records"] = records
    report["configurations"] = {
        "gate_records_before_the_preset": len(records),
        "world_gate_records": sum(not r["record"] == "arith_r2" for r in records),
        "distinct_configurations": len(configs), "configurations": configs,
        "old_rule_passes": passes, "seed_level_passes": [r["record"] for r in records if r["passes_seed_level_test"]],
        "note": "17 = the world_gate_*.json records before the preset (the pilots file holds two runs); they ran "
                f"{len({r['config'] for r in records if r['record'] != 'arith_r2'})} distinct configurations "
                f"({len(configs)} with the r = 2 pilot, which has no world_gate file)"}
    report["raw_matches_committed"] = {g: raw_matches_committed(g) for g in
                                       [r["source"][4:] for r in [*RECORDS, PRESET] if r["source"].startswith("raw:")]}

    # 2. the preset's gate, the seed as the unit
    preset = gate_reading(runs_of(PRESET))
    report["preset"] = {**PRESET, **preset}

    # 3. the failed preset (tau 0.02, the fading cosine) against the passing one (T = 200), seeds 3-5
    failed = gate_reading(next(runs_of(r) for r in RECORDS if r["record"] == "arith_g16_kl0.001_tau0.02_slr3e-5_fresh_s345"))
    common = sorted(set(failed["per_seed"]) & set(preset["per_seed"]))
    change = {s: preset["per_seed"][s]["difference"] - failed["per_seed"][s]["difference"] for s in common}
    report["passing_minus_failed_preset"] = {
        "seeds": common, "per_seed": change, "test": paired_t(list(change.values())),
        "failed_preset": {s: failed["per_seed"][s]["difference"] for s in common}}

    # 4. Base-T run twice on seeds 3-5 (the frozen teacher does not see teacher.max_steps; the first
    # gate's Base-T ran steps 1-10 on a GPU, the second all on 2 cores)
    b1 = last_third_means("arith_g16_kl0.001_tau0.02_slr3e-5_fresh_s345", "base")
    b2 = last_third_means("arith_horizon200", "base")
    report["base_t_rerun"] = {"first": b1, "second": b2,
                              "second_minus_first": {s: b2[s] - b1[s] for s in sorted(set(b1) & set(b2))},
                              "sd_of_the_change": float(np.std([b2[s] - b1[s] for s in set(b1) & set(b2)], ddof=1)),
                              "note": "steps 1-10 of the first runs were on a GPU; both last thirds (steps 28-40) "
                                      "on 2 cores"}

    # 5. the old rule's false-positive rate (dev/scripts/gate_rule_fpr.py)
    fpr = RESULTS / "gate_rule_fpr.json"
    report["old_rule_false_positive_rate"] = json.loads(fpr.read_text())["summary"] if fpr.exists() else None

    # 6. fresh students by teacher seed
    fresh = {}
    for gate in ("arith_g16_kl0.001_tau0.02_slr3e-5", "arith_g16_kl0.001_tau0.02_slr3e-5_fresh_s345", "arith_horizon200"):
        rows = fresh_by_teacher_seed(gate)
        fresh[gate] = {"by_teacher_seed_pass32": rows,
                       "comparisons_points": {f"{a} - {b}": compare_fresh(rows, a, b) for a, b in FRESH_COMPARISONS
                                              if a in rows and b in rows}}
        ho, pq = student_level(gate, "Hard-Only"), student_level(gate, "SOAR-PQ")
        fresh[gate]["pseudo_replicated_pq_minus_hard_only"] = {
            "students": [len(pq), len(ho)], "pq_sets": len(rows.get("SOAR-PQ", {})),
            "difference": float(np.mean(pq) - np.mean(ho)) if pq and ho else None,
            "se_over_students": float(np.sqrt(np.var(pq, ddof=1) / len(pq) + np.var(ho, ddof=1) / len(ho)))
            if pq and ho else None,
            "hard_only_students": ho}
    report["fresh_students"] = fresh

    # 7. the paired reading: both teachers' last-third datasets against one shared student, per seed
    per_seed = {}
    for s in (3, 4, 5):
        d = json.loads((RESULTS / f"after_promotion_paired_horizon200_s{s}.json").read_text())
        per_seed[s] = {"mean": d["against"]["as_written_minus_against"]["gold_prob"]["mean"],
                       "datasets": d["against"]["as_written_minus_against"]["gold_prob"]["n"]}
    report["paired_reading"] = {"per_seed": per_seed, "test": paired_t([v["mean"] for v in per_seed.values()]),
                                "pooled_over_datasets_not_independent": mean_se(
                                    [x for s in (3, 4, 5) for x in json.loads(
                                        (RESULTS / f"after_promotion_paired_horizon200_s{s}.json").read_text())
                                     ["against"]["as_written_minus_against"]["gold_prob"]["values"]])}
    Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    p = report["preset"]
    print(f"{report['configurations']['note']}; old-rule passes {passes}")
    print(f"preset seeds 3-5: {p['paired_t_one_sided']['mean']:+.4f} +- {p['paired_t_one_sided']['se']:.4f}, "
          f"t {p['paired_t_one_sided']['t']:.2f}, df {p['paired_t_one_sided']['df']}, two-sided p {p['p_two_sided']:.2f} "
          f"(step-level z {p['step_level_z_not_independent']['z']:.1f}, not independent)")
    t = report["passing_minus_failed_preset"]["test"]
    print(f"passing - failed preset, seeds 3-5: {t['mean']:+.4f} +- {t['se']:.4f}")
    print("Base-T rerun:", {s: round(v, 4) for s, v in report["base_t_rerun"]["second_minus_first"].items()})
    c = fresh["arith_horizon200"]["comparisons_points"]["SOAR-PQ - Base-T PQ"]["selected"]
    print("SOAR-PQ - Base-T PQ by teacher seed:", {s: round(v, 1) for s, v in c["per_seed_points"].items()},
          f"{c['test']['mean']:+.1f} +- {c['test']['se']:.1f}")
    t = report["paired_reading"]["test"]
    print(f"paired reading over seeds: {t['mean']:+.3f} +- {t['se']:.3f} (n {t['n']})")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
