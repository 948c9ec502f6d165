"""Each command builds only its own parser: a broken or missing experiments package cannot break ``fit``,
``info``, ``demo`` or ``--help``, and ``--help`` imports nothing that ``import onlinefa`` does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from onlinefa.cli import EXPERIMENTS_MISSING, main


def run_cli(argv: list[str], cwd: Path, extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m onlinefa.cli ARGV`` in a fresh interpreter, with ``extra_path`` first on its import path."""
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "onlinefa.cli", *argv], capture_output=True, text=True,
                          cwd=str(cwd), env=env, timeout=300)


@pytest.fixture
def broken_experiments(tmp_path: Path) -> Path:
    """A folder whose ``onlinefa_experiments`` package fails to import, as a broken experiment module would."""
    package = tmp_path / "broken" / "onlinefa_experiments"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('a deliberately broken experiment module')\n")
    return tmp_path / "broken"


@pytest.mark.slow
def test_fit_info_demo_and_help_run_beside_a_broken_experiment(tmp_path: Path, broken_experiments: Path) -> None:
    rows = np.random.default_rng(0).standard_normal((50, 6))
    np.save(tmp_path / "rows.npy", rows)
    fit = run_cli(["fit", "rows.npy", "-k", "2", "-o", "model.npz"], tmp_path, broken_experiments)
    assert fit.returncode == 0, fit.stderr
    info = run_cli(["info", "model.npz"], tmp_path, broken_experiments)
    assert info.returncode == 0 and "OnlineEM" in info.stdout, info.stderr
    for argv in (["--help"], ["demo", "--help"], ["fit", "--help"], ["--version"]):
        done = run_cli(argv, tmp_path, broken_experiments)
        assert done.returncode == 0, (argv, done.stderr)
    # The experiment command itself does fail, with the import error of the broken module.
    broken = run_cli(["experiment", "fa-synthetic"], tmp_path, broken_experiments)
    assert broken.returncode != 0 and "deliberately broken" in broken.stderr


def test_experiment_without_the_experiments_package_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "onlinefa_experiments", None)  # makes the import fail as if not installed
    assert main(["experiment", "fa-synthetic", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"onlinefa experiment: error: {EXPERIMENTS_MISSING}"
    assert "pip install -e experiments" in err


PROBE = """
import json, sys
import onlinefa
before = set(sys.modules)
from onlinefa.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(set(sys.modules) - before)))
"""


@pytest.mark.parametrize("argv", [["--help"], ["--version"]], ids=["help", "version"])
def test_help_imports_nothing_beyond_the_package_but_the_command_line(argv: list[str], tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=str(tmp_path),
                          timeout=120, check=True)
    added = json.loads(done.stdout.strip().splitlines()[-1])
    assert [name for name in added if name.startswith("onlinefa")] == ["onlinefa.cli"]
    assert "onlinefa_experiments" not in added


def test_fit_does_not_import_the_experiments(tmp_path: Path) -> None:
    np.save(tmp_path / "rows.npy", np.random.default_rng(1).standard_normal((30, 4)))
    code = PROBE.replace("print(json.dumps(sorted(set(sys.modules) - before)))",
                         "print(json.dumps(sorted(n for n in sys.modules if n.startswith('onlinefa_experiments'))))")
    done = subprocess.run([sys.executable, "-c", code, "fit", "rows.npy", "-k", "1", "-o", "m.npz"],
                          capture_output=True, text=True, cwd=str(tmp_path), timeout=120, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    assert (tmp_path / "m.npz").exists()
