"""What a full ``experiment=paper_math`` run costs on each shipped GPU layout, and what every GPU holds: the
memory plan of each (``soar.memory_plan``, from Llama-3.2-3B's config.json in tests/data) and the allocated
GPU-hours ``soar-estimate --layout`` projects (``soar.estimate.project_config``) from the labelled inputs of
``soar.estimate.COST_INPUTS`` (measured: where and when; assumed: why), with and without promotions, and how
the chosen layout's projection moves with the inputs that decide it. No GPU needed; JSON out, and the tables
of docs/paper_setting.md printed as markdown.

    python benchmarks/layouts.py --out benchmarks/results/layouts.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import soar  # noqa: E402
from soar.estimate import COST_INPUTS, CostInput, project_config, rounded  # noqa: E402
from soar.memory_plan import check_plan, model_shape, plan  # noqa: E402

SHAPE = REPO / "tests" / "data" / "llama3.2-3b"
"""Llama-3.2-3B's config.json (the plan needs the shape only)."""

LAYOUTS = {
    "paper_math_lora (chosen)": ["experiment=paper_math_lora", "backend=vllm"],
    "paper_math, vLLM students": ["experiment=paper_math", "backend=vllm", "backend.student=vllm"],
    "paper_math, vLLM": ["experiment=paper_math", "backend=vllm"],
    "paper_math, HF": ["experiment=paper_math", "backend=hf"],
}
"""Each shipped layout of the paper's setting on 8 H200 (conf/experiment/paper*.yaml) and its generation."""
CHOSEN = "paper_math_lora (chosen)"

SENSITIVITY = {
    "LoRA at the FLOP ratio": {"train_lora_s": (2 / 3 * COST_INPUTS["train_full_s"].value,
                                                "assumed: LoRA's step at 2/3 of full FT's (a backward without "
                                                "weight gradients), where the measured one is 1.29x")},
    "completions 300 tokens": {"completion_mean_tokens": (300, "assumed")},
    "completions 600 tokens": {"completion_mean_tokens": (600, "assumed")},
    "5 % cut at max_tokens": {"completion_capped_frac": (0.05, "assumed")},
    "30 % cut at max_tokens": {"completion_capped_frac": (0.30, "assumed")},
    "vLLM at 40 k tokens/s": {"vllm_tokens_per_s": (40000, "assumed")},
    "micro-batches sorted by length": {"sorted_micro_batches": (1, "assumed: built")},
}
"""The inputs the chosen layout's projection leans on, moved one at a time."""


def with_inputs(changes: dict) -> dict:
    inputs = dict(COST_INPUTS)
    inputs.update({name: CostInput(value, source) for name, (value, source) in changes.items()})
    return inputs


def project_all() -> dict:
    shape = model_shape(SHAPE)
    layouts, plans = {}, {}
    for name, overrides in LAYOUTS.items():
        cfg = soar.compose(overrides, config_name="train")
        memory = check_plan(cfg, shape=shape, memory=plan(cfg, shape))
        plans[name] = memory.to_dict()
        layouts[name] = {"overrides": overrides, "no_promotion": project_config(cfg, promotions=0),
                         "promotions": project_config(cfg)}
    chosen = soar.compose(LAYOUTS[CHOSEN], config_name="train")
    sensitivity = {label: {"no_promotion": project_config(chosen, with_inputs(changes), 0)["allocated_gpu_hours"],
                           "promotions": project_config(chosen, with_inputs(changes))["allocated_gpu_hours"]}
                   for label, changes in SENSITIVITY.items()}
    both = with_inputs({**SENSITIVITY["LoRA at the FLOP ratio"], **SENSITIVITY["completions 300 tokens"],
                        **SENSITIVITY["micro-batches sorted by length"]})
    sensitivity["all three: LoRA at the FLOP ratio, 300 tokens, sorted"] = {
        "no_promotion": project_config(chosen, both, 0)["allocated_gpu_hours"],
        "promotions": project_config(chosen, both)["allocated_gpu_hours"]}
    return rounded({"benchmark": "layouts", "chosen": CHOSEN, "layouts": layouts, "plans": plans,
                    "sensitivity": sensitivity, "paper_gpu_hours": [1500, 1900]})


def markdown(result: dict) -> str:
    lines = []
    for name, memory in result["plans"].items():
        lines += [f"{name}:", "", "| GPU | what shares it (GiB) | needs | of |", "|---|---|---|---|"]
        for gpu in memory["gpus"]:
            count = f" (x{gpu['count']})" if gpu["count"] > 1 else ""
            parts = " + ".join(f"{what} {gib:.1f}" for what, gib in gpu["parts_gib"].items())
            lines.append(f"| {gpu['gpu']}{count} | {parts} | {gpu['needs_gib']:.1f} | {gpu['capacity_gib']:.0f} |")
        lines.append("")
    lines += ["| layout | GPUs | no promotion (K = 10) | 3 promotions (K 10 → 20) | busy |", "|---|---|---|---|---|"]
    for name, row in result["layouts"].items():
        a, b = row["no_promotion"], row["promotions"]
        lines.append(f"| {name} | {a['gpus']} | {a['allocated_gpu_hours']:,.0f} | {b['allocated_gpu_hours']:,.0f} | "
                     f"{100 * b['busy_fraction']:.0f} % |")
    chosen = result["layouts"][result["chosen"]]["promotions"]["spans"][0]
    inner, work = chosen["inner"], chosen["work"]
    lines += ["", f"Chosen layout, one outer step at K = {chosen['K']} (seconds): "
              + ", ".join(f"{p['phase']} {p['s']:.1f} ({p['busy_gpus']:g} busy)" for p in chosen["timeline"])
              + f"; a student's inner step {work['student_inner_s']:.1f} = rollouts {inner['rollouts_s']:.1f} + push "
              f"{inner['push_s']:.1f} + training {inner['train_s']:.1f}; its Q_R evaluation {work['student_eval_s']:.1f}",
              "", "| chosen layout with | no promotion | 3 promotions |", "|---|---|---|"]
    for label, row in result["sensitivity"].items():
        lines.append(f"| {label} | {row['no_promotion']:,.0f} | {row['promotions']:,.0f} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/layouts.json")
    args = ap.parse_args(argv)
    result = project_all()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
