"""Exceptions of onlinefa that are not Python built-ins (a leaf module: it imports nothing of the package)."""

from __future__ import annotations


class CommandError(Exception):
    """A user-facing failure of the ``onlinefa`` command: printed as one line, exit code 2, no traceback."""
