"""Reproducible experiments, run as ``onlinefa experiment <name>``.

Each experiment is a module in this package that defines

``NAME``
    the sub-command name (e.g. ``"fa-synthetic"``),
``HELP``
    a one-line description,
``add_arguments(parser)``
    adds its options to an :class:`argparse.ArgumentParser`,
``run(args) -> int``
    runs it and returns the process exit code.

Experiments need the ``experiments`` extra (SciPy, scikit-learn, matplotlib, tqdm).
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: Modules (relative to this package) that hold one experiment each, in the order ``--help`` lists them.
EXPERIMENT_MODULES: tuple[str, ...] = (
    "fa_synthetic",
    "linreg_iterates",
    "linreg_window",
    "linreg_vifa",
    "uci_linreg",
    "swag",
    "calibration",
    "uci_bnn",
    "vbfa_transform",
    "gfa",
)


def available() -> dict[str, ModuleType]:
    """Return ``{name: module}`` for every experiment module that exists in this installation."""
    found: dict[str, ModuleType] = {}
    for module_name in EXPERIMENT_MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{module_name}")
        except ModuleNotFoundError as err:
            if err.name == f"{__name__}.{module_name}":
                continue  # experiment not shipped (yet)
            raise
        found[module.NAME] = module
    return found
