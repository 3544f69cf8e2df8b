"""Per-role metrics of a team's episodes (``soar-team``'s ``team/*`` rows of ``metrics.jsonl`` and its
``eval/*`` rows): pure, from the episodes alone (``tests/test_team_metrics.py`` checks them by hand).

With ``p`` the prefix (``team/`` or ``eval/``):

- ``p episodes``, ``p dropped`` and ``p dropped/<role>/<reason>``: episodes, and those dropped because an
  output that must parse did not (a coach's), by role and reason;
- ``p <role>/accuracy`` for each graded role; ``p accuracy_before`` (the first graded role) and
  ``p accuracy_after`` (the last), over the episodes not dropped;
- ``p wrong_to_right`` and ``p right_to_wrong``: counts of first attempts made right, and made wrong;
- ``p fix_rate/<type>`` and ``p wrong_first/<type>``: of the wrong first attempts of each error type (the
  world's diagnosis, ``soar.team.formats.ERROR_TYPES``, else the critique's stated type), the share made right;
- ``p <role>/leaked``, ``p <role>/parse_fail``: outputs that carried the gold answer; that did not parse;
- ``p score/<role>/mean``, ``mean_if_right``, ``mean_if_wrong`` (by the final answer), ``corr_success`` (Pearson,
  absent when either side is constant), ``dropped`` (unparseable), ``leaked``: the process coach's scores
  against success;
- ``p tokens_per_episode`` (every sampled token of an episode, its sibling revision included) and
  ``p <role>/tokens_mean``;
- ``p without_critique_accuracy``: the sibling revisions' accuracy (``coach_delta``).
"""

from __future__ import annotations

import numpy as np

from soar.team.episode import ChainInfo, Episode
from soar.team.formats import ERROR_TYPES


def first_error_type(e: Episode, chain: ChainInfo) -> str:
    """The error type of an episode's first attempt: the world's diagnosis of it, else what its critique says."""
    diagnose = ERROR_TYPES.get(chain.parsers[chain.first])
    if diagnose is not None:
        return diagnose(e.question, e.turns[chain.first].text)
    if chain.critique_role and chain.critique_role in e.turns:
        return e.turns[chain.critique_role].parsed.error_type or "unknown"
    return "unknown"


def episode_metrics(episodes: list[Episode], chain: ChainInfo, prefix: str) -> dict[str, float]:
    p = prefix
    live = [e for e in episodes if e.dropped is None]
    out: dict[str, float] = {f"{p}episodes": float(len(episodes)), f"{p}dropped": float(len(episodes) - len(live))}
    for e in episodes:
        if e.dropped is not None:
            out[f"{p}dropped/{e.dropped}"] = out.get(f"{p}dropped/{e.dropped}", 0.0) + 1
    for role in chain.roles:
        turns = [e.turns[role] for e in episodes if role in e.turns]
        if not turns:
            continue
        out[f"{p}{role}/parse_fail"] = float(np.mean([not t.parsed.ok for t in turns]))
        if any(t.leaked for t in turns) or role in chain.trained:
            out[f"{p}{role}/leaked"] = float(sum(t.leaked for t in turns))
        if turns[0].agent is not None:
            out[f"{p}{role}/tokens_mean"] = float(np.mean([len(t.token_ids) for t in turns]))
    out[f"{p}tokens_per_episode"] = float(np.mean([sum(len(t.token_ids) for t in e.turns.values())
                                                   + (len(e.without_critique.token_ids) if e.without_critique else 0)
                                                   for e in episodes])) if episodes else 0.0
    if not live:
        return out
    for role in chain.graded:
        out[f"{p}{role}/accuracy"] = float(np.mean([bool(e.turns[role].correct) for e in live]))
    first = [bool(e.turns[chain.first].correct) for e in live]
    final = [bool(e.turns[chain.final].correct) for e in live]
    out[f"{p}accuracy_before"], out[f"{p}accuracy_after"] = float(np.mean(first)), float(np.mean(final))
    out[f"{p}wrong_to_right"] = float(sum(not a and b for a, b in zip(first, final)))
    out[f"{p}right_to_wrong"] = float(sum(a and not b for a, b in zip(first, final)))
    by_type: dict[str, list[bool]] = {}
    for e, a, b in zip(live, first, final):
        if not a:
            by_type.setdefault(first_error_type(e, chain), []).append(b)
    for kind, fixed in sorted(by_type.items()):
        out[f"{p}wrong_first/{kind}"] = float(len(fixed))
        out[f"{p}fix_rate/{kind}"] = float(np.mean(fixed))
    siblings = [e.without_critique.correct for e in live if e.without_critique is not None]
    if siblings:
        out[f"{p}without_critique_accuracy"] = float(np.mean([bool(c) for c in siblings]))
    out.update(score_metrics(live, chain, p))
    return out


def score_metrics(live: list[Episode], chain: ChainInfo, p: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for role in chain.roles:
        turns = [(e.turns[role], bool(e.turns[chain.final].correct)) for e in live if role in e.turns]
        if not any(t.score is not None or t.score_dropped for t, _ in turns):
            continue
        scored = [(t.score, ok) for t, ok in turns if t.score is not None]
        out[f"{p}score/{role}/dropped"] = float(sum(t.score_dropped is not None for t, _ in turns))
        out[f"{p}score/{role}/leaked"] = float(sum(t.score_leaked for t, _ in turns))
        if not scored:
            continue
        s = np.array([x for x, _ in scored], dtype=float)
        ok = np.array([y for _, y in scored], dtype=float)
        out[f"{p}score/{role}/mean"] = float(s.mean())
        if ok.any():
            out[f"{p}score/{role}/mean_if_right"] = float(s[ok == 1].mean())
        if not ok.all():
            out[f"{p}score/{role}/mean_if_wrong"] = float(s[ok == 0].mean())
        if s.std() > 0 and ok.std() > 0:
            out[f"{p}score/{role}/corr_success"] = float(np.corrcoef(s, ok)[0, 1])
    return out
