"""What a non-editable install carries: every data file under edgeplan/ (the profiler's speed probe, the Coral
benchmark rows) is named by pyproject.toml's package-data, else a wheel leaves it out and the command that
reads it fails on an installed device (the speed probe was missing from the wheel until this test)."""
from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_data_file_of_the_package_is_in_the_wheel():
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    data = [p for p in (ROOT / "edgeplan").rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")
            and "__pycache__" not in p.parts]
    assert data, "no data files found under edgeplan/"
    missing = []
    for path in data:
        package = path.parent
        while not (package / "__init__.py").is_file():
            package = package.parent
        name = ".".join(package.relative_to(ROOT).parts)
        rel = path.relative_to(package).as_posix()
        if not any(fnmatch(rel, g) for g in globs.get(name, [])):
            missing.append(f"{name}: {rel}")
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
