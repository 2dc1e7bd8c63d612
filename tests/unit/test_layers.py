"""The import contracts in pyproject.toml ([tool.importlinter]) hold, and each one catches what it is for.

import-linter checks them (``lint-imports``); these tests run it as CI does, on the checkout, then on
a copy of the package with one bad import added, so a contract that no longer checks anything (a
layer list that matches no module, a misspelt id) fails here too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(cwd: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on ``cwd``'s pyproject.toml; it imports ``compress`` from ``cwd`` first."""
    assert LINT_IMPORTS.is_file(), f"{LINT_IMPORTS} missing; pip install -c constraints.txt -e '.[dev]'"
    selected = [arg for contract in contracts for arg in ("--contract", contract)]
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", *selected], cwd=cwd, capture_output=True, text=True
    )


def test_the_import_contracts_hold():
    done = lint_imports(REPO)
    assert done.returncode == 0, f"an import breaks a contract in pyproject.toml:\n{done.stdout}{done.stderr}"
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("contract", "module", "added", "expected"),
    [
        ("layers", "targets.py", "import compress.stages", "compress.targets is not allowed to import"),
        ("layers", "unplaced.py", "", "compress.unplaced"),
        ("acyclic", "gate.py", "from compress.report import SCHEMA", "No cycles are allowed in compress"),
        ("runner-standalone", "runtime/runner.py", "import torch", "compress.runtime.runner -> torch"),
        ("runner-standalone", "runtime/runner.py", "import compress.errors", "-> compress.errors"),
        ("cli-adapters", "pipeline.py", "import click", "compress.pipeline -> click"),
    ],
)
def test_a_contract_catches_the_import_it_forbids(tmp_path, contract, module, added, expected):
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(REPO / "compress", tmp_path / "compress", ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "compress" / module
    path.write_text((path.read_text() if path.exists() else "") + f"\n{added}\n")
    done = lint_imports(tmp_path, contract)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "BROKEN" in done.stdout and expected in done.stdout, done.stdout + done.stderr
