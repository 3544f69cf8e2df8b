"""What one run of a team's chain leaves: a ``Turn`` per role, an ``Episode`` per problem and sample, and the
records the credit functions read (``credit_inputs``). Plain data: the metrics (``soar.team.metrics``) and
the tests build them by hand."""

from __future__ import annotations

from dataclasses import dataclass, field

from soar.team.credit import ActionRecord, EpisodeRecord
from soar.team.formats import Parsed


@dataclass
class Turn:
    role: str
    agent: str | None
    """The policy that wrote it (None: a tool)."""
    prompt: str
    text: str
    token_ids: list[int]
    """The sampled completion ids (EOS included); [] for a tool."""
    parsed: Parsed
    trained: bool = False
    leaked: bool = False
    """Its text carried the gold answer: withheld from later roles, earns 0."""
    correct: bool | None = None
    """A graded role's answer was right (None: not graded)."""
    score: float | None = None
    """The process coach's score, 0-10, after noise (None: not scored, or dropped)."""
    score_text: str = ""
    score_dropped: str | None = None
    """Why the coach's score was dropped (``unparseable``); the action then trains on nothing."""
    score_leaked: bool = False
    """The coach's scoring text carried the gold answer: its score was zeroed."""


@dataclass
class Episode:
    question: str
    answer: str
    group: int
    """Index of its problem in the step (episodes of one group share it)."""
    source: str = ""
    turns: dict[str, Turn] = field(default_factory=dict)
    dropped: str | None = None
    """``<role>/<reason>`` when a role's output that must parse did not (a coach's): the episode trains on
    nothing and later roles do not run."""
    without_critique: Turn | None = None
    """``coach_delta``'s sibling revision: the final role run on the same input with no critique."""


@dataclass(frozen=True)
class ChainInfo:
    """What the metrics and credit need of a chain: its roles in order, the graded ones, the trained ones."""

    roles: tuple[str, ...]
    graded: tuple[str, ...]
    trained: tuple[str, ...]
    parsers: dict[str, str]
    """Each role's output format: its parser, or a tool's name (``soar.team.formats.ERROR_TYPES`` is keyed by it)."""
    critique_role: str | None = None
    """The role whose stated ``error_type`` types a first attempt where the world has no diagnosis."""

    @property
    def first(self) -> str:
        return self.graded[0]

    @property
    def final(self) -> str:
        return self.graded[-1]


def credit_inputs(episodes: list[Episode], chain: ChainInfo, needs_scores: bool
                  ) -> tuple[list[EpisodeRecord], list[ActionRecord], list[Turn]]:
    """The live episodes as ``EpisodeRecord``s and their trained turns as ``ActionRecord``s (with the turns, in
    the same order). With ``needs_scores`` a turn whose score was dropped is left out (counted elsewhere)."""
    records, actions, turns = [], [], []
    for e in (e for e in episodes if e.dropped is None):
        first, final = e.turns[chain.first], e.turns[chain.final]
        sibling = e.without_critique.correct if e.without_critique is not None else None
        records.append(EpisodeRecord(e.group, bool(first.correct), bool(final.correct), sibling))
        for role in chain.trained:
            t = e.turns.get(role)
            if t is None or not t.token_ids or (needs_scores and t.score_dropped is not None):
                continue
            actions.append(ActionRecord(len(records) - 1, role, t.agent, len(t.token_ids), t.score, t.leaked))
            turns.append(t)
    return records, actions, turns
