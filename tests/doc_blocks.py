"""The fenced code blocks of the documentation pages, for the tests that run them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    code: str

    def lookup(self, table: dict[tuple[str, str], Any]) -> Any:
        """The entry of ``table`` for this block: keys are (file name, a string only this block contains)."""
        for (name, marker), value in table.items():
            if name == self.path.name and marker in self.code:
                return value
        return None


def fenced_blocks(path: Path) -> list[Block]:
    """The fenced blocks of the page at ``path``, in order, with their language tag and first line."""
    text = path.read_text(encoding="utf-8")
    return [
        Block(path, text[: match.start()].count("\n") + 1, match.group(1), match.group(2))
        for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)
    ]
