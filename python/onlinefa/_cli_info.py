"""``onlinefa info MODEL``: a checkpoint's model class, configuration and state summary."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CommandError


def add_parser(commands: Any, summary: str) -> None:
    """Register the ``info`` sub-command."""
    p = commands.add_parser(
        "info",
        help=summary,
        description="Load a checkpoint (written by save() or 'onlinefa fit'), verifying it in full, and print "
        "its model class, every scalar setting and the shape and value range of every array.",
    )
    p.add_argument("model", type=Path, help="checkpoint file")
    p.set_defaults(handler=run)


def describe(state: dict[str, Any]) -> list[str]:
    """One line per state entry: scalars as ``name = value``, arrays as shape, dtype and range."""
    lines = []
    for name in sorted(state):
        value = state[name]
        if isinstance(value, np.ndarray):
            summary = f"array {value.shape} {value.dtype}"
            if value.size and value.dtype.kind in "iuf":
                summary += f", min {value.min():.6g}, max {value.max():.6g}"
            lines.append(f"  {name:<24} {summary}")
        else:
            lines.append(f"  {name:<24} = {value!r}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Print the summary; returns the exit code."""
    from . import load
    from .checkpoint import load_state, stored_class

    try:
        model = load(args.model)  # every check of the model's own load, before anything is printed
        state = load_state(args.model, stored_class(args.model))
    except FileNotFoundError as err:
        raise CommandError(f"no such file: {args.model}") from err
    except (ValueError, OSError) as err:
        raise CommandError(str(err)) from err
    print(f"{args.model}: {type(model).__name__}")
    print("\n".join(describe(state)))
    return 0
