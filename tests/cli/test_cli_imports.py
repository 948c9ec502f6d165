"""The command line starts without the heavy optional packages: an experiment's dependencies are imported
only when that experiment runs (``onlinefa --help`` took seconds when every sub-command imported PyTorch
and scikit-learn)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "sklearn", "scipy", "matplotlib")

PROBE = """
import contextlib, io, json, sys
from onlinefa.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(json.dumps(sorted(name for name in {heavy} if name in sys.modules)))
"""


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["fit", "missing.npy", "-k", "2", "-o", "out.npz"], ["info", "x.npz"]],
    ids=["help", "refused-fit", "info-missing"],
)
def test_the_command_line_does_not_import_heavy_packages(argv: list[str], tmp_path: object) -> None:
    code = PROBE.format(heavy=repr(HEAVY))
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=str(tmp_path),
                          timeout=120, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []

