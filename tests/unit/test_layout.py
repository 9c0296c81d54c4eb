"""The code's shape, checked on every run: the import contracts (layers, no I/O in the
planning core, no cycles), one line saying what each module owns, modules under ~400 lines,
the spark-submit entry script importing only the driver, and every file the README or a
docstring cites existing."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted((ROOT / "airflow_eo").rglob("*.py"))
MAX_LINES = 400


def test_import_contracts_hold():
    """`lint-imports` with the contracts in pyproject.toml ([tool.importlinter])."""
    done = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_module_says_what_it_owns_and_stays_small(path):
    source = path.read_text()
    docstring = ast.get_docstring(ast.parse(source))
    assert docstring and docstring.splitlines()[0].strip(), f"{path.name} has no one-line summary"
    assert len(source.splitlines()) <= MAX_LINES, f"{path.name} has {len(source.splitlines())} lines"


def test_the_entry_script_imports_only_the_driver_and_nothing_imports_it():
    script = ast.parse((ROOT / "spark_jobs" / "kafka_to_delta.py").read_text())
    imported = {n.module for n in ast.walk(script) if isinstance(n, ast.ImportFrom)} | \
        {a.name for n in ast.walk(script) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m.startswith("airflow_eo")} == {"airflow_eo.driver.main"}
    for path in MODULES + sorted((ROOT / "dags").glob("*.py")):
        assert not re.search(r"^\s*(from|import) spark_jobs", path.read_text(), re.M), path


CITED = re.compile(r"(?<![\w/.-])((?:airflow_eo|tests|dags|spark_jobs|benchmarks|docker)/[\w./-]+\.(?:py|yml|toml))"
                   r"(?:::(\w+))?")


def cited_files() -> list[tuple[str, str, str | None]]:
    sources = [ROOT / "README.md", ROOT / "docker-compose.yml", *MODULES, *sorted((ROOT / "tests").rglob("*.py"))]
    found = []
    for source in sources:
        for match in CITED.finditer(source.read_text()):
            found.append((str(source.relative_to(ROOT)), match.group(1), match.group(2)))
    return found


def test_every_file_the_readme_or_a_docstring_cites_exists():
    missing = [(src, path, name) for src, path, name in cited_files()
               if not (ROOT / path).exists() or (name and f"def {name}(" not in (ROOT / path).read_text())]
    assert cited_files(), "the citation pattern found nothing: it is broken"
    assert missing == []
