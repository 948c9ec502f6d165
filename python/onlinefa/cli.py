"""The ``onlinefa`` command: ``fit``, ``info``, ``demo`` and ``experiment <name>``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from .errors import CommandError

__all__ = ["CommandError", "main"]


def _build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .experiments import available

    parser = argparse.ArgumentParser(
        prog="onlinefa",
        description="Online factor analysis of high-dimensional streams (online EM / SGA, VIFA).",
    )
    parser.add_argument("--version", action="version", version=f"onlinefa {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from . import _cli_demo, _cli_fit, _cli_info

    _cli_fit.add_parser(commands)
    _cli_info.add_parser(commands)
    _cli_demo.add_parser(commands)

    experiment = commands.add_parser("experiment", help="reproduce an experiment of the thesis")
    names = experiment.add_subparsers(dest="experiment", required=True, metavar="NAME")
    for name, module in available().items():
        sub = names.add_parser(name, help=module.HELP, description=module.HELP)
        try:
            module.add_arguments(sub)
        except ModuleNotFoundError as err:  # an optional extra is missing: every other command must still work
            sub.set_defaults(handler=_needs_extra(name, err.name or str(err)), missing_extra=True)
            continue
        sub.set_defaults(handler=module.run)
    return parser


def _needs_extra(experiment: str, missing: str) -> Callable[[argparse.Namespace], int]:
    """Handler of an experiment whose optional dependency ``missing`` is not installed."""

    def handler(args: argparse.Namespace) -> int:
        raise CommandError(
            f"experiment {experiment!r} needs the optional package {missing!r}, which is not installed "
            "(install the package's 'experiments' and 'torch' extras)"
        )

    return handler


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    parser = _build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "missing_extra", False):  # only such an experiment may keep unknown options
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args.handler(args))
    except CommandError as err:
        print(f"onlinefa {args.command}: error: {err}", file=sys.stderr)
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
