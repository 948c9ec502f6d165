"""`onlinefa demo` (and the CLI) with the core install only: torch, scikit-learn and scipy absent."""

from __future__ import annotations

import subprocess
import sys

# Make every import of the optional packages fail, as on `pip install onlinefa` without extras.
_BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("torch", "sklearn", "scipy", "matplotlib", "tqdm"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
from onlinefa.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _BLOCK, *argv], capture_output=True, text=True, timeout=300)


def test_demo_runs_without_the_optional_packages() -> None:
    done = _run("demo", "--only", "real", "--hidden", "4", "--pretrain-epochs", "5", "--snapshots", "12",
                "--rank", "2", "--draws", "3", "--dataset", "yacht")
    assert done.returncode == 0, done.stderr
    assert "online EM (default)" in done.stdout
    done = _run("demo", "--only", "synthetic", "--features", "12", "--components", "2")
    assert done.returncode == 0, done.stderr
    assert "batch FA (ML)" in done.stdout



def test_unknown_options_are_refused_without_the_optional_packages() -> None:
    assert _run("demo", "--bogus").returncode == 2
