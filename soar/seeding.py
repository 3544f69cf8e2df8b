"""Counter-based seeds: every random choice is a pure function of (run seed, stage, step, ...), so
results do not depend on execution order, resumption or worker count."""

import hashlib


def derive_seed(*parts) -> int:
    """A 31-bit seed from the run seed and any labels, e.g. ``derive_seed(seed, "rollout", step)``."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
