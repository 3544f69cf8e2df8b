"""This study's analysis (PROTOCOL.md) from the packed raw data alone: ``python analyze.py`` writes
``results.json`` and refuses partial data. The machinery is ``dev/studies/team_study.py``."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from team_study import analyze_main  # noqa: E402  (dev/studies/team_study.py)

if __name__ == "__main__":
    analyze_main(HERE)
