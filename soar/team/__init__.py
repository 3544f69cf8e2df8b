"""Teams of roles trained with RL (``soar-team``, issue 60; docs/team.md): a chain of roles given by config
(``soar.config.TeamConfig``), each a policy or a tool, credited by a registry of pure functions.

- ``credit``: the credit assignments (``shared_outcome``, ``outcome_only``, ``process``, ``coach_delta``), pure;
- ``sandbox``: the ``python_sandbox`` tool's subprocess (limits, no network, its own temp dir);
- ``formats``: output parsers, tools and programmatic scorers (registries a world adds to);
- ``metrics``: per-role metrics of a step's episodes, pure;
- ``rollout``: the chain: prompts, generation, leak check, parsing, grading, the process coach's scores;
- ``plan``: the team's GPU memory plan (``soar-estimate --plan`` of a team preset);
- ``train``: the ``soar-team`` stage.
"""
