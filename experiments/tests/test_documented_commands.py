"""Every ``onlinefa experiment ...`` command of README.md, docs/ and experiments/README.md parses.

Each one goes through the real entry point (``onlinefa.cli.main``) with every experiment's ``run`` replaced,
so that a wrong experiment name or option fails here while nothing takes the minutes or hours a real run
takes. Each experiment has its own test at a small size beside this one. Templates with placeholders
(``NAME``, ``[--quick]``) are left out; their concrete uses are parsed.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

import onlinefa_experiments
from onlinefa.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "experiments" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TEMPLATE = re.compile(r"\b[A-Z]{2,}\b|\[")


def documented_commands(page: Path) -> list[str]:
    """The ``onlinefa experiment`` commands of a page: lines of its fenced blocks and its inline code spans."""
    text = page.read_text(encoding="utf-8")
    found = []
    for block in re.findall(r"^```\w*\n(.*?)^```", text, flags=re.M | re.S):
        for line in block.splitlines():
            for part in re.sub(r"\s+#.*$", "", line).split("&&"):
                found.append(part.strip())
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    found += re.findall(r"`([^`\n]+)`", prose)
    return [c for c in found if c.startswith("onlinefa experiment ") and not TEMPLATE.search(c[20:])]


COMMANDS = sorted({(page.name, command) for page in PAGES if page.exists() for command in documented_commands(page)})


def test_the_pages_document_experiment_commands() -> None:
    """The collection works: the benchmark pages name their commands (a broken regex would parse nothing)."""
    assert {"uci_benchmark.md", "calibration.md", "README.md"} <= {page for page, _ in COMMANDS}


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{p}:{c[20:60]}" for p, c in COMMANDS])
def test_documented_command_parses(page: str, command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    reached: list[str] = []
    for name in onlinefa_experiments.EXPERIMENTS:
        module = onlinefa_experiments.load(name)
        monkeypatch.setattr(module, "run", lambda args, name=name: reached.append(name) or 0)
    argv = shlex.split(command)[1:]
    try:
        code = main(argv)
    except SystemExit as exit_:  # --help, or an argparse error (code 2)
        code = int(exit_.code or 0)
    assert code == 0, f"{page}: `{command}` exited with {code}"
    if "--help" not in argv:
        assert reached == [argv[1]], f"{page}: `{command}` did not reach its experiment"
