"""The worlds: small, download-free task domains that run the same code path as the paper's
(``world=<name>``; the interface and registry are ``soar.worlds.base``).

Importing this package imports every module of its folder, each registering its ``World``, so a new world
is one new file here: a plugin folder. ``tests/test_imports.py`` counts these imports by name in the
layer and cycle checks."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
