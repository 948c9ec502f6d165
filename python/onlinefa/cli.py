"""The ``onlinefa`` command: ``fit``, ``info``, ``demo`` and ``experiment <name>``.

Only the parser of the command being run is built (and only its module imported), so that ``onlinefa --help``
costs little more than ``import onlinefa`` and nothing one command needs can break another. The experiments
live in the separate ``onlinefa_experiments`` package (``pip install -e experiments`` from a clone of the
repository); ``onlinefa experiment`` hands its arguments to that package.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from .errors import CommandError

__all__ = ["CommandError", "main"]

#: The sub-commands: name -> (module under ``onlinefa`` that builds its parser, one-line help).
COMMANDS: dict[str, tuple[str, str]] = {
    "fit": ("_cli_fit", "fit a factor-analysis Gaussian to the rows of a .npy file and save it as a checkpoint"),
    "info": ("_cli_info", "print a checkpoint's model class, configuration and state summary"),
    "demo": (
        "_cli_demo",
        "the library's job: recover a synthetic FA model, and a SWAG-style posterior of a small network",
    ),
}
EXPERIMENT_HELP = "run an experiment or benchmark of the separate onlinefa_experiments package"
EXPERIMENTS_MISSING = (
    "the experiments are not installed: they are a separate package in the repository's experiments/ folder "
    "(from a clone: pip install -e experiments)"
)


def chosen_command(argv: Sequence[str]) -> str | None:
    """The sub-command ``argv`` names: its first word that is not an option, or ``None``."""
    return next((word for word in argv if not word.startswith("-")), None)


def _build_parser(command: str | None) -> argparse.ArgumentParser:
    """The top-level parser, with the full parser of ``command`` and only the name and help of the others."""
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="onlinefa",
        description="Online factor analysis of high-dimensional streams (online EM / SGA, VIFA).",
    )
    parser.add_argument("--version", action="version", version=f"onlinefa {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, summary) in COMMANDS.items():
        if name == command:
            importlib.import_module(f"{__package__}.{module_name}").add_parser(commands, summary)
        else:
            commands.add_parser(name, help=summary)
    commands.add_parser("experiment", help=EXPERIMENT_HELP, add_help=False)
    return parser


def run_experiment(argv: Sequence[str]) -> int:
    """``onlinefa experiment ARGV...``: hand the arguments to the experiments package, if it is installed."""
    try:
        import onlinefa_experiments
    except ModuleNotFoundError as err:
        if err.name != "onlinefa_experiments":
            raise
        raise CommandError(EXPERIMENTS_MISSING) from None
    return int(onlinefa_experiments.main(list(argv)))


def _dispatch(argv: list[str]) -> int:
    """Parse ``argv`` and run its command; returns the exit code."""
    command = chosen_command(argv)
    if command == "experiment":
        return run_experiment(argv[argv.index(command) + 1:])
    args = _build_parser(command).parse_args(argv)
    return int(args.handler(args))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    command = chosen_command(words) or "onlinefa"
    try:
        return _dispatch(words)
    except CommandError as err:
        print(f"onlinefa {command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("onlinefa: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (e.g. `onlinefa info MODEL | head`): stop quietly, as Unix tools do,
        # and point stdout at /dev/null so that the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
