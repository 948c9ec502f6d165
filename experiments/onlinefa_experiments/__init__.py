"""The experiments and benchmarks of onlinefa, run as ``onlinefa experiment <name>``.

A separate package from the library (``pip install -e experiments`` from a clone of the repository), so that
the installed ``onlinefa`` holds no research code. Each experiment is a module of this package that defines

``NAME``
    the sub-command name (e.g. ``"fa-synthetic"``),
``HELP``
    a one-line description,
``add_arguments(parser)``
    adds its options to an :class:`argparse.ArgumentParser`,
``run(args) -> int``
    runs it and returns the process exit code.

``onlinefa experiment NAME ...`` imports the module of ``NAME`` only; ``onlinefa experiment --help`` imports
them all to list them.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from types import ModuleType

from onlinefa.cli import chosen_command
from onlinefa.errors import CommandError

#: Experiment name -> the module (relative to this package) that holds it, in the order ``--help`` lists them.
EXPERIMENTS: dict[str, str] = {
    "fa-synthetic": "fa_synthetic",
    "linreg-iterates": "linreg_iterates",
    "linreg-window": "linreg_window",
    "linreg-vifa": "linreg_vifa",
    "uci-linreg": "uci_linreg",
    "swag": "swag",
    "calibration": "calibration",
    "uci-bnn": "uci_bnn",
    "vbfa-transform": "vbfa_transform",
    "gfa": "gfa",
}


def load(name: str) -> ModuleType:
    """The module of experiment ``name``."""
    module = importlib.import_module(f"{__name__}.{EXPERIMENTS[name]}")
    if module.NAME != name:
        raise RuntimeError(f"module {module.__name__} names its experiment {module.NAME!r}, not {name!r}")
    return module


def available() -> dict[str, ModuleType]:
    """Return ``{name: module}`` for every experiment, importing each."""
    return {name: load(name) for name in EXPERIMENTS}


def _needs_extra(experiment: str, missing: str) -> Callable[[argparse.Namespace], int]:
    """Handler of an experiment whose optional dependency ``missing`` is not installed."""

    def handler(args: argparse.Namespace) -> int:
        raise CommandError(
            f"experiment {experiment!r} needs the optional package {missing!r}, which is not installed "
            "(install onlinefa's 'torch' extra: pip install \".[torch]\")"
        )

    return handler


def build_parser(chosen: str | None) -> argparse.ArgumentParser:
    """The parser of ``onlinefa experiment``: the full options of ``chosen``, the names and help of the rest.

    With ``chosen`` ``None`` (``--help``, or no name) every module is imported for its one-line help.
    """
    parser = argparse.ArgumentParser(prog="onlinefa experiment", description="The experiments and benchmarks of onlinefa.")
    names = parser.add_subparsers(dest="experiment", required=True, metavar="NAME")
    for name in EXPERIMENTS:
        if chosen is not None and name != chosen:
            names.add_parser(name)
            continue
        module = load(name)
        sub = names.add_parser(name, help=module.HELP, description=module.HELP)
        try:
            module.add_arguments(sub)
        except ModuleNotFoundError as err:  # an optional extra is missing: say so when the experiment is run
            sub.set_defaults(handler=_needs_extra(name, err.name or str(err)), missing_extra=True)
            continue
        sub.set_defaults(handler=module.run)
    return parser


def main(argv: Sequence[str]) -> int:
    """Parse ``argv`` (the words after ``onlinefa experiment``) and run the experiment it names."""
    words = list(argv)
    chosen = chosen_command(words)
    parser = build_parser(chosen if chosen in EXPERIMENTS else None)
    args, unknown = parser.parse_known_args(words)
    if unknown and not getattr(args, "missing_extra", False):  # only such an experiment may keep unknown options
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return int(args.handler(args))
