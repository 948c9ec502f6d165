"""``onlinefa experiment``: the launcher hands its words to this package, which imports only the experiment run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import onlinefa_experiments
from onlinefa.cli import main

PROBE = """
import contextlib, io, json, sys
from onlinefa.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(json.dumps(sorted(name for name in sys.modules if name.startswith("onlinefa_experiments.")
                        or name in ("torch", "sklearn", "scipy", "matplotlib"))))
"""


def probe(*argv: str) -> list[str]:
    """The experiment modules and heavy packages a fresh interpreter holds after ``onlinefa ARGV``."""
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=300,
                          check=True)
    found: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_running_one_experiment_imports_only_its_module() -> None:
    # An option error stops the run after parsing: of the experiment modules only fa-synthetic's is imported
    # (its shared helpers may be), and nothing heavy.
    imported = probe("experiment", "fa-synthetic", "--trials", "not-a-number")
    experiment_modules = {f"onlinefa_experiments.{module}" for module in onlinefa_experiments.EXPERIMENTS.values()}
    assert [name for name in imported if name in experiment_modules] == ["onlinefa_experiments.fa_synthetic"]
    assert not {"torch", "sklearn", "scipy", "matplotlib"} & set(imported)


def test_experiment_help_lists_every_experiment_without_heavy_packages(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["experiment", "--help"])
    assert exit_.value.code == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in onlinefa_experiments.EXPERIMENTS)
    assert not {"torch", "sklearn", "scipy", "matplotlib"} & set(probe("experiment", "--help"))


def test_an_experiment_help_still_lists_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["experiment", "uci-bnn", "--help"])
    out = capsys.readouterr().out
    assert "--datasets" in out and "--quick" in out


def test_an_unknown_experiment_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["experiment", "no-such-experiment"])
    assert exit_.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_every_registered_module_names_its_experiment() -> None:
    assert sorted(onlinefa_experiments.available()) == sorted(onlinefa_experiments.EXPERIMENTS)


# Make every import of the optional packages fail, as beside a core install without the torch extra.
_BLOCK_TORCH = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "torch":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
from onlinefa.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_an_experiment_needing_torch_says_so() -> None:
    done = subprocess.run([sys.executable, "-c", _BLOCK_TORCH, "experiment", "uci-bnn", "--quick"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "needs the optional package 'torch'" in done.stderr
    assert "pip install" in done.stderr
