"""``team.*`` checked before any heavy work (``soar-team`` and ``soar-estimate --plan`` of a team preset): the
chain, each role's format or tool, the credit and what it needs, the process coach, the sandbox. A problem
is a ``ConfigError`` naming the field."""

from __future__ import annotations

import re

from soar.hydra_config import conf_dir
from soar.team.credit import CREDITS
from soar.team.formats import PARSERS, SCORERS, TOOLS
from soar.team.sandbox import NETWORK_MODES
from soar.validation import fail
from soar.worlds import arith_team_formats  # noqa: F401  (registers the team world's parsers, tools and scorer)


def validate_team(cfg) -> None:
    team = cfg.team
    chain = list(team.chain)
    if not chain:
        fail("team.chain", "is empty: a team needs at least one role (experiment=team_scr_arith_micro is one)")
    if len(set(chain)) != len(chain):
        fail("team.chain", f"names a role twice: {chain}")
    for name in chain:
        if name not in team.roles:
            fail("team.chain", f"role {name!r} has no settings (team.roles.{name}); roles: {sorted(team.roles)}")
    extra = sorted(set(team.roles) - set(chain))
    if extra:
        fail("team.roles", f"{extra} are not in team.chain {chain}")
    for i, name in enumerate(chain):
        _validate_role(cfg, name, chain[:i])
    if not any(team.roles[r].graded for r in chain):
        fail("team.chain", "no role is graded (team.roles.<name>.graded): nothing to score the team by")
    trained = [r for r in chain if team.roles[r].trained and not team.roles[r].tool]
    if not trained:
        fail("team.chain", "no policy role is trained (team.roles.<name>.trained)")
    if team.sharing not in ("shared", "per_role"):
        fail("team.sharing", f"must be shared or per_role, got {team.sharing!r}")
    _validate_credit(cfg, chain, trained)
    for name in ("kl_reward_coef", "fix_bonus", "outcome_weight", "eval_samples", "dump_every"):
        if getattr(team, name) < 0:
            fail(f"team.{name}", f"must be >= 0, got {getattr(team, name)}")
    if not 0 < team.gamma <= 1:
        fail("team.gamma", f"must be in (0, 1], got {team.gamma}")
    if team.eval_temperature <= 0:
        fail("team.eval_temperature", f"must be > 0, got {team.eval_temperature}")
    for name in team.eval_data:
        if not (conf_dir() / "data" / f"{name}.yaml").is_file():
            fail("team.eval_data", f"no data config {name!r} (conf/data/{name}.yaml)")
    _validate_scorer(cfg, trained)
    sb = team.sandbox
    if sb.network not in NETWORK_MODES:
        fail("team.sandbox.network", f"must be one of {', '.join(NETWORK_MODES)}, got {sb.network!r}")
    for name in ("timeout_s", "cpu_s", "memory_mb", "file_mb", "max_output_chars"):
        if getattr(sb, name) <= 0:
            fail(f"team.sandbox.{name}", f"must be > 0, got {getattr(sb, name)}")


def _validate_role(cfg, name: str, earlier: list[str]) -> None:
    team, role = cfg.team, cfg.team.roles[name]
    where = f"team.roles.{name}"
    unknown = [r for r in role.sees if r not in earlier]
    if unknown:
        fail(f"{where}.sees", f"{unknown} are not roles before {name!r} in team.chain")
    if [r for r in role.shuffle if r not in role.sees]:
        fail(f"{where}.shuffle", f"{list(role.shuffle)} must be roles it sees ({list(role.sees)})")
    if role.max_tokens < 1:
        fail(f"{where}.max_tokens", f"must be >= 1, got {role.max_tokens}")
    if role.tool is not None:
        if role.tool not in TOOLS:
            fail(f"{where}.tool", f"unknown tool {role.tool!r}; known: {', '.join(sorted(TOOLS))}")
        if TOOLS[role.tool].reads_reference and not role.oracle:
            fail(f"{where}.oracle", f"tool {role.tool} reads the reference answer: it may only run as a named upper "
                                    "bound (set oracle: true)")
        if role.trained:
            fail(f"{where}.trained", "a tool has no weights to train: set trained: false")
        return
    if role.oracle:
        fail(f"{where}.oracle", "only a tool that reads the reference is an oracle; a policy role never sees it")
    if role.parser not in PARSERS:
        fail(f"{where}.parser", f"unknown parser {role.parser!r}; known: {', '.join(sorted(PARSERS))}")
    slots = set(re.findall(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", role.template))
    if "question" not in slots:
        fail(f"{where}.template", "must contain a {question} slot")
    missing = [r for r in role.sees if r not in slots]
    if missing:
        fail(f"{where}.template", f"has no slot for {missing} (it sees {list(role.sees)})")
    unseen = sorted(s for s in slots & set(team.roles) if s not in role.sees)
    if unseen:
        fail(f"{where}.template", f"has slots {unseen} of roles it does not see (team.roles.{name}.sees)")


def _validate_credit(cfg, chain: list[str], trained: list[str]) -> None:
    team = cfg.team
    if team.credit not in CREDITS:
        fail("team.credit", f"must be one of {', '.join(CREDITS)}, got {team.credit!r}")
    credit = CREDITS[team.credit]
    if credit.needs_sibling:
        final = [r for r in chain if team.roles[r].graded][-1]
        coach = team.coach_role
        if coach not in chain or coach not in team.roles[final].sees:
            fail("team.coach_role", f"{team.credit} needs the critique role the final role ({final}) reads, got {coach!r}")
        if coach not in trained:
            fail("team.coach_role", f"{coach!r} is not a trained policy role: nothing to credit")
    if credit.needs_scores and team.scorer.kind is None:
        fail("team.scorer.kind", f"team.credit={team.credit} reads the process coach's scores: set a scorer "
                                 f"(llm, or {', '.join(sorted(SCORERS)) or 'a registered one'})")


def _validate_scorer(cfg, trained: list[str]) -> None:
    s = cfg.team.scorer
    if s.kind is None:
        return
    if s.kind != "llm" and s.kind not in SCORERS:
        fail("team.scorer.kind", f"must be llm or one of {', '.join(sorted(SCORERS))}, got {s.kind!r}")
    if not 0 <= s.noise <= 1:
        fail("team.scorer.noise", f"must be in [0, 1], got {s.noise}")
    if s.kind == "llm" and s.bias:
        fail("team.scorer.bias", "is a knob of a programmatic scorer; an LLM coach's bias is its own")
    if s.roles is not None and [r for r in s.roles if r not in trained]:
        fail("team.scorer.roles", f"{list(s.roles)} must be trained policy roles ({trained})")
    if s.kind == "llm" and (s.max_tokens < 1 or s.temperature < 0):
        fail("team.scorer.max_tokens" if s.max_tokens < 1 else "team.scorer.temperature", "must be >= 1 / >= 0")
    if s.kind == "llm":
        for slot in ("{question}", "{output}"):
            if slot not in s.prompt:
                fail("team.scorer.prompt", f"must contain a {slot} slot")
