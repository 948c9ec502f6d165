"""The README is for users: at most ~150 lines, and exactly the two set-up commands (the main job, the tests)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def shell_blocks(text: str) -> list[str]:
    return [code.strip() for code in re.findall(r"^```(?:bash|sh)\n(.*?)^```", text, flags=re.M | re.S)]


def test_the_readme_is_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 150


def test_the_readme_has_exactly_the_two_set_up_commands() -> None:
    blocks = shell_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) == 2
    main_job, suite = blocks
    assert main_job.endswith("pip install . && onlinefa demo")
    assert suite.endswith('pip install ".[test]" && pytest')


def test_the_block_finder_sees_shell_blocks() -> None:
    assert shell_blocks("x\n```bash\na\n```\n```python\nb\n```\n```sh\nc\n```\n") == ["a", "c"]
