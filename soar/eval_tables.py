"""``soar-eval`` results over seeds, as the paper reports them (Tables 4-6): ``aggregate`` reads each
run's ``eval.json`` (and ``questions.jsonl``) and gives mean ± SD per label and metric, with the Vendi score
of each label's question sets; ``markdown_table`` writes that as a table. ``soar-report`` (``soar.report``)
prints and plots it; one evaluation run is ``soar.evaluate``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from soar.diversity import bootstrap_vendi, load_embedder
from soar.rundata import read_json
from soar.stats import sample_sd


def aggregate(eval_dirs, diversity_model: str | None = None, which: str = "selected") -> dict:
    """Mean ± SD over seeds (``sample_sd``) per label and metric (the paper's Tables 4-6), plus the
    Vendi score of each label's final question sets the paper's way (bootstrap to 128 questions, 100
    times; mean ± SD over distinct sets). ``which``: ``selected`` (slope rule), ``fixed`` or ``final``."""
    by_label: dict[str, list[dict]] = {}
    for d in eval_dirs:
        summary = read_json(Path(d) / "eval.json")
        summary["dir"] = str(d)
        by_label.setdefault(summary["label"], []).append(summary)
    embedder = load_embedder(diversity_model) if diversity_model else None
    table = {}
    for label, rows in by_label.items():
        keys = sorted({k for r in rows for k in r.get(which, r["selected"]) if k.startswith("eval/")},
                      key=lambda k: (k != "eval/greedy_acc", int(k.split("@")[1]) if "@" in k else 0))
        values = {k: [r.get(which, r["selected"])[k] for r in rows] for k in keys}
        entry = {"seeds": len(rows), "metrics": {k: {"mean": float(np.mean(v)), "sd": sample_sd(v)}
                                                  for k, v in values.items()}}
        if embedder is not None:
            sets = {}
            for r in rows:
                qpath = Path(r["dir"]) / "questions.jsonl"
                qs = ([json.loads(x)["question"] for x in qpath.read_text().splitlines() if x.strip()]
                      if qpath.exists() else [])
                if len(qs) >= 2:
                    sets[tuple(qs)] = qs
            scores = [bootstrap_vendi(embedder.encode(qs, show_progress_bar=False), 128, 100, seed=0)[0]
                      for qs in sets.values()]
            if scores:
                entry["vendi"] = {"mean": float(np.mean(scores)), "sd": sample_sd(scores), "sets": len(scores)}
        table[label] = entry
    return {"which": which, "table": table}


def _mean_sd(entry: dict, scale: float, digits: int) -> str:
    sd = f"{scale * entry['sd']:.{digits}f}" if entry["sd"] is not None else "–"
    return f"{scale * entry['mean']:.{digits}f} ± {sd}"


def markdown_table(agg: dict) -> str:
    """The aggregate as a Markdown table (values in %, mean ± SD; – for one seed), like the paper's Tables 4-6."""
    table = agg["table"]
    keys = sorted({k for e in table.values() for k in e["metrics"]},
                  key=lambda k: (k != "eval/greedy_acc", int(k.split("@")[1]) if "@" in k else 0))
    head = "| method | seeds | " + " | ".join(k.removeprefix("eval/") for k in keys) + " | Vendi |"
    lines = [head, "|" + "---|" * (len(keys) + 3)]
    for label, e in table.items():
        cells = [_mean_sd(e["metrics"][k], 100, 1) if k in e["metrics"] else "-" for k in keys]
        vendi = _mean_sd(e["vendi"], 1, 2) if "vendi" in e else "-"
        lines.append(f"| {label} | {e['seeds']} | " + " | ".join(cells) + f" | {vendi} |")
    return "\n".join(lines) + "\n"
