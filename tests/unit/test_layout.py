"""The code's shape, checked on every run: the import contracts (layers, no I/O in the
planning core, no cycles), one line saying what each module owns, the spark-submit entry
script importing only the driver, every file the README, the docs or a docstring cites existing, and
the static checks configured in pyproject.toml: ruff over the code and the tests, mypy over
the pure core, the spec and the table's value types. A module's size follows its concept:
there is no line cap."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted((ROOT / "airflow_eo").rglob("*.py"))
BIN = Path(sys.executable).parent


def test_import_contracts_hold():
    """`lint-imports` with the contracts in pyproject.toml ([tool.importlinter])."""
    done = subprocess.run([str(BIN / "lint-imports"), "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_module_says_what_it_owns(path):
    docstring = ast.get_docstring(ast.parse(path.read_text()))
    assert docstring and docstring.splitlines()[0].strip(), f"{path.name} has no one-line summary"


def test_ruff_finds_nothing():
    """`ruff check` with the rules of pyproject.toml ([tool.ruff]) over the code, the tests and the scripts."""
    # each venv its own cache: CI runs several Python versions' lanes side by side in one checkout
    done = subprocess.run([str(BIN / "ruff"), "check", "--no-fix", "--output-format", "concise",
                           "--cache-dir", os.path.join(sys.prefix, "ruff-cache"), "."], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_mypy_finds_nothing():
    """`mypy` over the files of pyproject.toml ([tool.mypy]): the core, the spec, the table side, the audit."""
    done = subprocess.run([str(BIN / "mypy"), "--cache-dir", os.path.join(sys.prefix, "mypy-cache")], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout


def test_the_entry_script_imports_only_the_driver_and_nothing_imports_it():
    script = ast.parse((ROOT / "spark_jobs" / "kafka_to_delta.py").read_text())
    imported = {n.module for n in ast.walk(script) if isinstance(n, ast.ImportFrom)} | \
        {a.name for n in ast.walk(script) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m.startswith("airflow_eo")} == {"airflow_eo.driver.main"}
    for path in MODULES + sorted((ROOT / "dags").glob("*.py")):
        assert not re.search(r"^\s*(from|import) spark_jobs", path.read_text(), re.M), path


# What a test must not lean on: a function's default values patched in place, or the Spark
# provider's private methods (read the command a recording spark-submit receives instead:
# tests/unit/submit/conftest.py).
FORBIDDEN_IN_TESTS = {"__defaults__", "_build_spark_submit_command", "_resolve_connection"}


def test_no_test_patches_defaults_or_calls_a_providers_private_methods():
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.attr if isinstance(node, ast.Attribute) else node.value if isinstance(node, ast.Constant) else None
            if name in FORBIDDEN_IN_TESTS and path != Path(__file__):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert found == []


CITED = re.compile(r"(?<![\w/.-])((?:airflow_eo|tests|dags|spark_jobs|benchmarks|docker)/[\w./-]+\.(?:py|yml|toml))"
                   r"(?:::(\w+))?")


def cited_files() -> list[tuple[str, str, str | None]]:
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "docker-compose.yml", *MODULES,
               *sorted((ROOT / "tests").rglob("*.py"))]
    found = []
    for source in sources:
        for match in CITED.finditer(source.read_text()):
            found.append((str(source.relative_to(ROOT)), match.group(1), match.group(2)))
    return found


def test_every_file_the_readme_the_docs_or_a_docstring_cites_exists():
    missing = [(src, path, name) for src, path, name in cited_files()
               if not (ROOT / path).exists() or (name and f"def {name}(" not in (ROOT / path).read_text())]
    assert cited_files(), "the citation pattern found nothing: it is broken"
    assert missing == []


def test_every_file_the_package_reads_is_package_data():
    """A template, stylesheet or script beside the code ships in the wheel only if pyproject.toml's
    package-data names it (the fresh-install test in tests/integration catches it late, this early)."""
    import fnmatch

    try:
        import tomllib
    except ImportError:  # Python 3.10: pytest's own dependency
        import tomli as tomllib  # type: ignore[no-redef]

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    data = [p for p in (ROOT / "airflow_eo").rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")
            and "__pycache__" not in p.parts]
    assert data, "the package has data files (the UI page's templates): none found"
    def shipped(path: Path) -> bool:
        for package, patterns in globs.items():
            home = ROOT / package.replace(".", "/")
            if path.is_relative_to(home) and any(fnmatch.fnmatch(str(path.relative_to(home)), g) for g in patterns):
                return True
        return False

    missed = [str(p.relative_to(ROOT)) for p in data if not shipped(p)]
    assert not missed, f"not in [tool.setuptools.package-data]: {missed}"


# Where a write mode may be named (airflow_eo/sinks/ and docs/development.md, "Adding a write mode"): its
# sink, the spec that configures it, the Spark steps of dedup and merge, and the two definitions of what a
# table's mark and a commit's record say. Everything else asks the table's sink.
WRITE_MODE_HOMES = ("airflow_eo/sinks/", "airflow_eo/spec/", "airflow_eo/testing/", "airflow_eo/driver/dedup.py",
                    "airflow_eo/driver/merge.py", "airflow_eo/driver/cdc.py")
RECORDED_WRITE_MODE = {("airflow_eo/table/ledger.py", "def is_merge_table("),
                       ("airflow_eo/table/metadata.py", "return WriteMode.MERGE if self.merge is not None")}
_WRITE_MODE_CHECK = re.compile(r"\.(merge|dedup)\.enabled\b|WriteMode\.(MERGE|APPEND)\b|is_merge_table\(|"
                               r"write_mode\"?\)?\s*(==|is)\s|dedup\.to_dead_letters|merge\.cdc_format")


def test_only_the_sinks_branch_on_write_modes():
    found = []
    for path in MODULES:
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(WRITE_MODE_HOMES):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            recorded = any(rel == f and line.strip().startswith(s) for f, s in RECORDED_WRITE_MODE)
            if _WRITE_MODE_CHECK.search(line) and not recorded:
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "write modes decided outside airflow_eo/sinks/ (ask the table's sink):\n" + "\n".join(found)
