"""This study's runs (PROTOCOL.md), resumable: ``python run.py --out DIR`` (``--status``: counts only;
``--pilot``: one run of each arm on the pilot seed, to time it; never analysed). The machinery is
``dev/studies/team_study.py``."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from team_study import run_main  # noqa: E402  (dev/studies/team_study.py)

if __name__ == "__main__":
    run_main(HERE)
