"""A world outside the package, as a user would write one (issue 61): this module and ``echo.yaml`` beside it,
registered by an entry point of group ``soar.worlds`` that names this module (``tests/test_world.py`` installs
one in a temporary site folder). The echo world asks a model to repeat a number: its problems, its grader (the
package's ``integer``), its prompt and its exact-answer oracle. Its model is the user's (``model.path``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from soar.data import Problem, write_jsonl
from soar.seeding import derive_seed
from soar.worlds.base import World, register_world


@dataclass
class EchoWorldConfig:
    """Settings of the echo world (``cfg.world``)."""

    name: str = "echo"
    """The world (``world=echo``)."""
    seed: int = 0
    """Seed of the problem files."""
    digits: int = 4
    """Digits of each number to repeat."""
    pool_size: int = 16
    """Hard-set candidates ``build_pool`` writes."""
    student_template: str = "Repeat {question}: "
    """The student's prompt (``data.prompt_template`` reads it, from ``echo.yaml``)."""


def echo_problems(wcfg: EchoWorldConfig, count: int, prefix: str) -> list[Problem]:
    rng = np.random.default_rng(derive_seed(wcfg.seed, "echo", prefix))
    numbers = ["".join(map(str, rng.integers(1, 10, size=wcfg.digits))) for _ in range(count)]
    return [Problem(id=f"{prefix}/{i}", question=n, answer=n, source="echo") for i, n in enumerate(numbers)]


@register_world
class EchoWorld(World):
    name = "echo"
    config_class = EchoWorldConfig
    config_file = Path(__file__).with_name("echo.yaml")

    def build_pool(self, cfg, out_dir: Path) -> Path:
        wcfg, path = self.config(cfg), Path(out_dir) / "pool.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(path, [p.to_dict() for p in echo_problems(wcfg, wcfg.pool_size, "pool")])
        return path

    def oracle_problems(self, cfg, count: int) -> list[Problem]:
        return echo_problems(self.config(cfg), count, "oracle")

    def answer_oracle(self, cfg, question: str) -> str | None:
        return question if question.isdigit() and len(question) == self.config(cfg).digits else None
