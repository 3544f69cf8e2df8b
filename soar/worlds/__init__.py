"""The worlds: small, download-free task domains that run the same code path as the paper's
(``world=<name>``; the interface and registry are ``soar.worlds.base``).

Importing this package registers every world: the package's own (one import line each, below) and those
other packages name by an entry point of group ``soar.worlds``, each a module that registers its ``World``
(``[project.entry-points."soar.worlds"] mine = "mypackage.mine"``). Composing a config imports them all, so
a world module imports no torch and no role code at its top (``soar.worlds.base``)."""

from importlib.metadata import entry_points

from soar.config import ConfigError
from soar.worlds import arith, arith_team  # noqa: F401  (each registers its World)

for _entry in entry_points(group="soar.worlds"):
    try:
        _entry.load()
    except ImportError as exc:
        raise ConfigError(f"config error: world: the entry point {_entry.name} = {_entry.value!r} (group soar.worlds) "
                          f"cannot be imported: {exc}") from exc
