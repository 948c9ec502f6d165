"""The compiled core is the one stable-ABI (abi3) extension, and the build is configured for it.

A source tree built before the switch to abi3 keeps its ``_core.cpython-3XX-*.so`` next to the new
``_core.abi3.so``, and Python prefers the version-specific file: the tests would then run stale code.
"""

from __future__ import annotations

import re
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import onlinefa._core

ROOT = Path(__file__).resolve().parents[2]


def test_the_loaded_core_is_the_only_abi3_extension() -> None:
    core = Path(onlinefa._core.__file__)
    assert core.name.endswith(".abi3.so") or core.suffix == ".pyd", f"not a stable-ABI extension: {core}"
    others = [p.name for p in core.parent.glob("_core.*")
              if p != core and any(p.name.endswith(suffix) for suffix in EXTENSION_SUFFIXES)]
    assert not others, f"stale extension module(s) next to {core.name}, delete them: {others}"


def test_pyo3_targets_the_stable_abi_of_the_oldest_supported_python() -> None:
    cargo = (ROOT / "Cargo.toml").read_text(encoding="utf-8")
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    pyo3 = re.search(r"^pyo3 = \{(.*)\}$", cargo, flags=re.M)
    assert pyo3 is not None and '"abi3-py310"' in pyo3.group(1)
    assert re.search(r'^requires-python = ">=3.10"$', pyproject, flags=re.M)
