"""A team's chain run on a batch of problems (``run_chain``) and its actions scored by the process coach
(``score_turns``).

Per role, in ``team.chain`` order, over the episodes still live: the prompts (``template`` with
``{question}`` and each seen role's shown output; ``shuffle``: read from another episode, a seeded
derangement), one generate call (``n`` = 1 per episode, the seed derived from the run seed, the phase, the
step and the role) or the tool, then the leak check (``leak_check``: a text carrying the gold answer is
withheld from later roles and earns 0), the parser (an output that must parse and does not drops the
episode) and, for a graded role, the grader. With ``sibling`` the last graded role also revises each input
with ``team.no_critique_text`` in place of the critique (``coach_delta``), in the same generate call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from soar.coach import fill_slots
from soar.data import Problem
from soar.generation import make_generator
from soar.leak import leaks
from soar.models import check_context, load_model, load_tokenizer, model_context
from soar.resolve import resolve_backend
from soar.samples import SamplingParams
from soar.seeding import derive_seed
from soar.team.episode import ChainInfo, Episode, Turn
from soar.team.formats import PARSERS, SCORERS, TOOLS, Parsed, ScoreCall, ToolCall, parse_score

SHARED_AGENT = "policy"
"""The agent of every policy role under ``team.sharing=shared``."""
BASE_AGENT = "base"
"""The agent of an untrained role under ``team.sharing=per_role``: the base model, frozen."""


def agent_of(team, name: str) -> str | None:
    """The policy that writes role ``name`` (None: a tool)."""
    role = team.roles[name]
    if role.tool:
        return None
    if team.sharing == "shared":
        return SHARED_AGENT
    return name if role.trained else BASE_AGENT


def chain_info(team) -> ChainInfo:
    roles = tuple(team.chain)
    graded = tuple(r for r in roles if team.roles[r].graded)
    trained = tuple(r for r in roles if team.roles[r].trained and not team.roles[r].tool)
    critique = team.coach_role or next((r for r in roles if team.roles[r].parser == "critique_json"), None)
    return ChainInfo(roles, graded, trained, {r: team.roles[r].tool or team.roles[r].parser for r in roles}, critique)


def derangement(n: int, rng: np.random.Generator) -> list[int]:
    """``src[i]``: the episode whose output episode ``i`` reads; never ``i`` itself when ``n`` > 1."""
    perm = rng.permutation(n)
    src = [0] * n
    for k in range(n):
        src[perm[k]] = int(perm[(k + 1) % n])
    return src


@dataclass
class ChainRun:
    """How one call samples: ``phase`` (``rollout`` or ``eval``) and the step key its seeds derive from."""

    phase: str
    step: int
    greedy: bool
    temperature: float
    samples: int
    """Episodes per problem."""
    sibling: bool = False
    """Also revise without the critique (``coach_delta``)."""


def run_chain(cfg, problems: list[Problem], run: ChainRun, generators: dict, tokenizer, grader, context: int
              ) -> list[Episode]:
    """The chain on ``problems``, ``run.samples`` episodes each; ``generators[agent]`` samples each policy."""
    team = cfg.team
    info = chain_info(team)
    episodes = [Episode(p.question, p.answer, q, p.source) for q, p in enumerate(problems) for _ in range(run.samples)]
    for name in team.chain:
        role = team.roles[name]
        live = [e for e in episodes if e.dropped is None]
        if not live:
            break
        views = _views(live, role, derive_seed(cfg.seed, "team", run.phase, run.step, name, "shuffle"))
        if role.tool:
            tool = TOOLS[role.tool]
            for e, view in zip(live, views):
                parsed = tool.fn(ToolCall(cfg, e.question, view, e.answer if role.oracle else None))
                e.turns[name] = Turn(name, None, "", parsed.shown, [], parsed)
        else:
            _policy_turns(cfg, name, live, views, run, generators, tokenizer, context, info)
        if role.graded:
            graded = [e.turns[name] for e in live if e.dropped is None]
            graded += [e.without_critique for e in live if e.without_critique is not None and name == info.final]
            answers = [e.answer for e in live if e.dropped is None]
            answers += [e.answer for e in live if e.without_critique is not None and name == info.final]
            grades = grader.grade_batch(["" if t.parsed.answer is None else f"\\boxed{{{t.parsed.answer}}}" for t in graded],
                                        answers)
            for t, g in zip(graded, grades):
                t.correct = bool(g.correct)
    return episodes


def _views(live: list[Episode], role, seed: int) -> list[dict[str, str]]:
    """Per live episode, what the role reads: each seen role's shown output (``shuffle``: another episode's)."""
    src = derangement(len(live), np.random.default_rng(seed)) if role.shuffle else list(range(len(live)))
    return [{r: live[src[i] if r in role.shuffle else i].turns[r].parsed.shown for r in role.sees}
            for i in range(len(live))]


def _policy_turns(cfg, name: str, live: list[Episode], views, run: ChainRun, generators, tokenizer, context: int,
                  info: ChainInfo) -> None:
    team = cfg.team
    role, agent = team.roles[name], agent_of(team, name)
    prompts = [fill_slots(role.template, question=e.question, **view) for e, view in zip(live, views)]
    sibling = run.sibling and name == info.final and team.coach_role in role.sees
    if sibling:
        prompts += [fill_slots(role.template, question=e.question, **{**view, team.coach_role: team.no_critique_text})
                    for e, view in zip(live, views)]
    check_context(tokenizer, prompts, role.max_tokens, context, f"team.roles.{name}.max_tokens")
    params = SamplingParams(n=1, greedy=run.greedy, temperature=run.temperature, max_tokens=role.max_tokens,
                            seed=derive_seed(cfg.seed, "team", run.phase, run.step, name), stop=tuple(role.stop))
    outs = generators[agent].generate(prompts, params)
    parser = PARSERS[role.parser]
    trained = role.trained
    for i, e in enumerate(live):
        sample = outs[i][0]
        leaked = role.leak_check and leaks(sample.text, e.answer)
        parsed = parser.fn(sample.text)
        if leaked:  # withheld: later roles read no critique, and the action earns 0 (soar.team.credit)
            parsed = Parsed(parsed.ok, team.no_critique_text, parsed.answer, parsed.error_type, "leaked")
        elif not parsed.ok and parser.drops:
            e.dropped = f"{name}/{parsed.reason}"
        e.turns[name] = Turn(name, agent, prompts[i], sample.text, list(sample.token_ids), parsed, trained, leaked)
        if sibling:
            s = outs[len(live) + i][0]
            e.without_critique = Turn(name, agent, prompts[len(live) + i], s.text, list(s.token_ids), parser.fn(s.text))


# ---- the process coach ----------------------------------------------------------------------------------
class LLMScorer:
    """MAPPA's coach as a local LLM: ``team.scorer.model`` (default the policy's model) writing from
    ``team.scorer.prompt`` on the coach role's backend (``backend.coach``; with vLLM the engine holds the only
    copy of its weights)."""

    def __init__(self, cfg):
        s = cfg.team.scorer
        model_cfg = s.model if s.model.path else cfg.model
        tokenizer = load_tokenizer(model_cfg)
        model = None
        if resolve_backend(cfg.backend, "coach") == "hf":  # vLLM serves its own copy: no HF weights loaded
            model = load_model(model_cfg)
            model.eval().requires_grad_(False)
        self.cfg, self.tokenizer = cfg, tokenizer
        self.context = model_context(model, model_cfg) if model is not None else model_cfg.max_context
        """The coach's context to check its prompts against (None: a vLLM engine refuses what does not fit)."""
        self.generator = make_generator(cfg, "coach", model, tokenizer, pristine=True, engine_path=model_cfg.path)

    def score(self, calls: list[ScoreCall], seed: int) -> list[tuple[str, float | None]]:
        s = self.cfg.team.scorer
        prompts = [fill_slots(s.prompt, question=c.question, role=c.role, input=c.prompt, output=c.output,
                              reference=c.reference if c.reference is not None else s.hidden_reference) for c in calls]
        if self.context:
            check_context(self.tokenizer, prompts, s.max_tokens, self.context, "team.scorer.max_tokens")
        params = SamplingParams(n=1, greedy=s.temperature == 0, temperature=s.temperature or 1.0,
                                max_tokens=s.max_tokens, seed=seed)
        outs = self.generator.generate(prompts, params) if prompts else []
        return [(o[0].text, parse_score(o[0].text)) for o in outs]


class ProgrammaticScorer:
    """A registered scorer (``soar.team.formats.SCORERS``), e.g. the embedded world's stand-in."""

    def __init__(self, cfg):
        self.fn = SCORERS[cfg.team.scorer.kind]

    def score(self, calls: list[ScoreCall], seed: int) -> list[tuple[str, float | None]]:
        return [self.fn(c) for c in calls]


def make_scorer(cfg):
    """The process coach ``team.scorer.kind`` names, or None."""
    kind = cfg.team.scorer.kind
    if kind is None:
        return None
    return LLMScorer(cfg) if kind == "llm" else ProgrammaticScorer(cfg)


def scored_roles(team) -> list[str]:
    s = team.scorer
    return list(s.roles) if s.roles is not None else list(chain_info(team).trained)


def score_turns(cfg, episodes: list[Episode], scorer, step: int) -> None:
    """The coach's score of each scored role's turn in each live episode: an unparseable score is dropped
    (``score_dropped``), never a default; a scoring text that carries the gold answer is zeroed and counted;
    then ``team.scorer.noise`` replaces a score by a uniform draw of 0-10 (one draw per scored turn, seeded)."""
    team = cfg.team
    calls, turns = [], []
    for e in (e for e in episodes if e.dropped is None):
        for role in scored_roles(team):
            t = e.turns.get(role)
            if t is None:
                continue
            rc = team.roles[role]
            inputs = {r: e.turns[r].parsed.shown for r in rc.sees if r in e.turns}
            calls.append(ScoreCall(cfg, role, rc.parser, e.question, t.text, inputs,
                                   e.answer if rc.scorer_sees_reference else None, t.prompt))
            turns.append((e, t))
    results = scorer.score(calls, derive_seed(cfg.seed, "team", "score", step))
    rng = np.random.default_rng(derive_seed(cfg.seed, "team", "score_noise", step))
    for (e, t), (text, score) in zip(turns, results):
        replace, draw = rng.random() < team.scorer.noise, float(rng.integers(0, 11))
        t.score_text = text
        if score is None:
            t.score, t.score_dropped = None, "unparseable"
            continue
        if leaks(text, e.answer):
            t.score, t.score_leaked = 0.0, True
            continue
        t.score = draw if replace else float(score)
