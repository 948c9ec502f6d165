"""Run a script under Triton's interpreter in a fresh Python (``TRITON_INTERPRET`` is read when a kernel is
defined) and return the JSON object it prints last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def run_interpreted(script: str, config: dict[str, Any]) -> dict[str, Any]:
    """``script`` run with ``json.dumps(config)`` as its argument and ``TRITON_INTERPRET=1``; fails the test with
    the script's error output if it does not exit cleanly."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", script, json.dumps(config)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


#: The start of a script comparing a fused streaming pass with the plain one: ``config`` (minus ``dtype``) from
#: the argument, a correlated stream ``X`` of 40 rows in D = 150 (two row blocks, the second partial), K = 3,
#: ``count_calls(module, name)`` (the calls of a module's function land in ``calls``), ``cov`` and ``rel``.
STREAMING_PREAMBLE = """
import json, sys
import numpy as np, torch, onlinefa

config = json.loads(sys.argv[1])
dtype = config.pop("dtype")
d, k = 150, 3
rng = np.random.default_rng(0)
X = (rng.standard_normal((40, d)) @ rng.standard_normal((d, d)) / np.sqrt(d) + rng.standard_normal(d)) * 1e-2
calls = []

def count_calls(module, name):
    original = getattr(module, name)
    def counted(*args):
        calls.append(1)
        return original(*args)
    setattr(module, name, counted)

def cov(m):
    _, f, psi = m.snapshot()
    f, psi = np.asarray(f), np.asarray(psi)
    return f @ f.T + np.diag(psi)

rel = lambda a, b: float(np.abs(a - b).max() / np.abs(b).max())
"""
