"""What installs declare: every third-party import of the package is a declared dependency, the
bare package (the CLI and client) imports nothing heavy, and constraints.txt pins versions that
every declared lower bound accepts."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def _declared(groups: list[str] | None = None) -> dict[str, Requirement]:
    """Direct requirements of the base package and of the named extras (all extras: None)."""
    found = {_name(Requirement(raw).name): Requirement(raw) for raw in PYPROJECT["dependencies"]}
    extras = PYPROJECT["optional-dependencies"]
    for group in extras if groups is None else groups:
        for raw in extras[group]:
            requirement = Requirement(raw)
            if _name(requirement.name) != "tuneforge":
                found[_name(requirement.name)] = requirement
    return found


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level modules the package imports (at any depth of its code) -> the files importing them."""
    stdlib = set(sys.stdlib_module_names)
    found: dict[str, set[str]] = {}
    for path in (ROOT / "src" / "tuneforge").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in stdlib and top != "tuneforge":
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_third_party_import_is_a_declared_dependency():
    declared = set(_declared())
    owners = metadata.packages_distributions()
    # GPU-only kernels and engines, checked for at run time (train/fused_loss.py, train/vllm_rollouts.py)
    optional_here = {"liger_kernel", "bitsandbytes", "vllm"}
    missing = {}
    for module, files in _third_party_imports().items():
        if module in optional_here:
            continue
        distributions = {_name(d) for d in owners.get(module, [module])}
        if not distributions & declared:
            missing[module] = sorted(files)[:3]
    assert not missing, missing


def test_the_bare_package_imports_nothing_heavy():
    """The CLI as the bare install has it: only the base dependencies (and the standard library)."""
    code = ("import sys, tuneforge.cli.main\n"
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                timeout=120).stdout.split())
    for heavy in ("torch", "transformers", "numpy", "sqlalchemy", "fastapi", "openai", "pyarrow", "ray", "peft"):
        assert heavy not in loaded, heavy
    base = {_name(Requirement(raw).name) for raw in PYPROJECT["dependencies"]}
    allowed = _closure(base)
    owners = metadata.packages_distributions()
    # httpx loads click for its own command line, and zstandard to decode zstd answers, when they
    # happen to be installed (optional there; the test extras' tinker SDK installs zstandard)
    incidental = {"tuneforge", "cython_runtime", "click", "zstandard"}
    stray = {module for module in loaded - set(sys.stdlib_module_names) - incidental
             if not module.startswith("_") and not {_name(d) for d in owners.get(module, [module])} & allowed}
    assert not stray, stray


def _closure(names: set[str]) -> set[str]:
    found, pending = set(), list(names)
    while pending:
        name = pending.pop()
        if name in found:
            continue
        found.add(name)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for raw in requires:
            requirement = Requirement(raw)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(_name(requirement.name))
    return found


def test_constraints_pin_every_dependency_within_its_declared_range():
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[_name(name)] = Version(version)
    runtime = [group for group in PYPROJECT["optional-dependencies"] if group != "dev"]  # not the test tools
    for name, requirement in _declared(runtime).items():
        if name == "torch":
            continue  # the host picks torch's build
        assert name in pins, f"{name} is not pinned in constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (name, str(requirement.specifier),
                                                                               pins[name])


def test_the_extras_compose_as_documented():
    extras = PYPROJECT["optional-dependencies"]
    assert "tuneforge[train]" in extras["server"]
    assert extras["all"] == ["tuneforge[server,postgres,s3,ray,tracking,redis]"]
    assert "tuneforge[all]" in extras["dev"]
    assert not {"torch", "fastapi", "sqlalchemy"} & {_name(Requirement(r).name) for r in PYPROJECT["dependencies"]}
