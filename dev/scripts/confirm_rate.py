"""The confirmation's rate, for dev/LOG.md: per run folder, the median over its outer steps of seconds per
student step (``time/step_wall_s`` / ``compute/student_steps``) and its wall time. Above 0.6 s per student step,
something else is running beside the runs (issue 56).

    python dev/scripts/confirm_rate.py [/work/confirm/runs]
"""

import json
import statistics
import sys
from pathlib import Path


def main() -> None:
    runs = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/confirm/runs")
    for d in sorted(runs.glob("*_s*")):
        if not (d / "metrics.jsonl").exists():
            continue
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
        rates = [r["time/step_wall_s"] / max(r["compute/student_steps"], 1) for r in rows]
        if rates:
            print(f"{d.name}: {len(rows)} steps, median {statistics.median(rates):.3f} s per student step, "
                  f"wall {sum(r['time/step_wall_s'] for r in rows):.0f} s")


if __name__ == "__main__":
    main()
