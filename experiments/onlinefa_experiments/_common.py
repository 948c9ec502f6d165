"""Small helpers shared by the experiments: output folders, CSV rows, progress bars."""

from __future__ import annotations

import csv
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def output_dir(path: str | os.PathLike[str]) -> Path:
    """Create (if needed) and return the experiment's output folder."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def progress(items: Iterable[T], *, total: int | None = None, desc: str = "") -> Iterator[T]:
    """Wrap ``items`` in a tqdm progress bar on stderr when stderr is a terminal; otherwise (logs, pipes)
    yield them as they are, so nested bars leave no escape sequences in the output."""
    if not sys.stderr.isatty():
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, total=total, desc=desc, leave=False, dynamic_ncols=True)


def _complete_length(path: Path) -> int:
    """Bytes of ``path`` up to and including its last newline: what a kill mid-append leaves whole."""
    with path.open("rb") as handle:
        data = handle.read()
    return data.rfind(b"\n") + 1


def append_rows(path: Path, rows: Iterable[Mapping[str, Any]], fieldnames: list[str]) -> None:
    """Append ``rows`` to the CSV at ``path``, writing the header if the file is new; a torn last line (a
    writer killed mid-row) is cut off first. Each call ends with the rows on disk (``fsync``)."""
    if path.exists():
        whole = _complete_length(path)
        if whole < path.stat().st_size:
            os.truncate(path, whole)
    new_file = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fieldnames)
        if new_file:
            writer.writeheader()
        for row in rows:
            writer.writerow(row)
        handle.flush()
        os.fsync(handle.fileno())


def read_rows(path: Path) -> list[dict[str, str]]:
    """Read every whole row of a CSV written by :func:`append_rows` (empty list if absent): a torn last line
    and rows without every column are left out."""
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        text = handle.read()
    text = text[: text.rfind("\n") + 1]
    reader = csv.DictReader(text.splitlines())
    return [row for row in reader if None not in row and all(value is not None for value in row.values())]


def write_rows(path: Path, rows: Iterable[Mapping[str, Any]], fieldnames: list[str]) -> None:
    """Replace the CSV at ``path`` by ``rows`` atomically (a temporary file renamed over it)."""
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fieldnames)
        writer.writeheader()
        for row in rows:
            writer.writerow(row)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
