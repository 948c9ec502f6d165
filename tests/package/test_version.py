"""One version: Cargo.toml's, read by maturin into the package metadata and exposed as onlinefa.__version__."""

from __future__ import annotations

import re
from pathlib import Path

import onlinefa

ROOT = Path(__file__).resolve().parents[2]


def test_the_version_is_cargos() -> None:
    cargo = (ROOT / "Cargo.toml").read_text(encoding="utf-8")
    package = cargo.split("[package]", 1)[1].split("\n[", 1)[0]
    match = re.search(r'^version\s*=\s*"([^"]+)"', package, flags=re.M)
    assert match is not None
    assert onlinefa.__version__ == match.group(1)
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    project = pyproject.split("[project]", 1)[1].split("\n[", 1)[0]
    assert re.search(r"^version\s*=", project, flags=re.M) is None  # not written twice
    assert re.search(r'^dynamic\s*=\s*\["version"\]', project, flags=re.M) is not None
