"""The documentation: the site builds with warnings as errors, its examples run, its links resolve.

- `mkdocs build --strict` (mkdocs.yml): a broken link or anchor between pages, a page missing
  from the nav, or a docstring the API reference cannot render fails here. It builds in this
  process, so the unit lane's network guard (tests/unit/conftest.py) holds for it: the build
  fetches nothing.
- Every ```python block of README.md and docs/ runs (most define a DAG: the operator refuses an
  option the spec does not have), with the operator classes imported for fragments that show
  one call. A block that cannot run here (it needs a cluster, a table or a package the project
  does not install) says so on the line before it: ``<!-- not run: <reason> -->``.
- A ```python block that includes a file of the repository (``--8<-- "tests/…"``, pymdownx.snippets)
  shows that file as it is: the file must be a module the integration lane runs (a test module, or
  one a test module next to it imports), so the example on the page is what CI runs.
- Every ```pycon block runs as a doctest.
- Every link of README.md resolves: relative files exist, anchors name a heading.
"""

from __future__ import annotations

import doctest
import logging
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_hooks" not in p.parts)
NOT_RUN = re.compile(r"^<!-- not run: (\S.*) -->$")
INCLUDE = re.compile(r'^--8<-- "([^"]+)"$')
# what a fragment showing one call leans on (a complete example imports it itself)
PRELUDE = """
from airflow_eo.operators.delta_maintenance import DeltaMaintenanceOperator
from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator
from airflow_eo.sensors.kafka_backlog import KafkaBacklogSensor
"""


def test_the_site_builds_strict(tmp_path, caplog):
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    config = load_config(str(ROOT / "mkdocs.yml"), strict=True, site_dir=str(tmp_path / "site"))
    with caplog.at_level(logging.WARNING, logger="mkdocs"):
        try:
            build(config)
        except SystemExit as exc:  # mkdocs' Abort: "Aborted with N warnings in strict mode"
            pytest.fail(f"mkdocs build --strict failed: {exc}\n" + "\n".join(r.getMessage() for r in caplog.records))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    site = tmp_path / "site"
    # the generated reference is there: the operator's options from its docstring, the CLI from argparse
    assert "max_offsets_per_task" in (site / "reference" / "operators" / "index.html").read_text()
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "airflow-eo maintain" in cli and "--retain-hours" in cli and "<!-- cli-reference -->" not in cli


def code_blocks(path: Path, language: str) -> list[tuple[int, str, str | None]]:
    """(line, code, reason it is not run) of each ```language block of ``path``."""
    lines, found, i = path.read_text().split("\n"), [], 0
    while i < len(lines):
        if lines[i].strip() == f"```{language}":
            start, before = i + 1, lines[i - 1].strip() if i else ""
            end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
            reason = m.group(1) if (m := NOT_RUN.match(before)) else None
            found.append((start, "\n".join(lines[start:end]), reason))
            i = end
        i += 1
    return found


SOURCES = [ROOT / "README.md", *PAGES]
PYTHON = [(p, line, code, reason) for p in SOURCES for line, code, reason in code_blocks(p, "python")]
PYCON = [(p, line, code) for p in SOURCES for line, code, _ in code_blocks(p, "pycon")]


def test_examples_are_found_and_most_run():
    assert len([x for x in PYTHON if x[3] is None]) >= 8, "the example search found too few: it is broken"
    assert PYCON, "no ```pycon block found: the doctest search is broken"


@pytest.mark.parametrize("path, line, code, reason", PYTHON,
                         ids=[f"{p.relative_to(ROOT)}:{line}" for p, line, _, _ in PYTHON])
def test_python_example_runs(path, line, code, reason):
    if (included := INCLUDE.match(code.strip())) is not None:
        assert_run_by_a_lane(included.group(1))
        return
    if reason is not None:
        assert len(reason) > 10, f"{path}:{line}: say why the example is not run"
        return  # marked, with its reason, in the page itself (a visible choice, not a silent skip)
    exec(compile(PRELUDE + code, f"{path.relative_to(ROOT)}:{line}", "exec"), {"__name__": "docs_example"})


def assert_run_by_a_lane(name: str) -> None:
    """``name`` is a test module of the integration lane, or imported by one beside it."""
    path = ROOT / name
    assert path.exists() and path.is_relative_to(ROOT / "tests" / "integration"), f"{name}: not in the integration lane"
    if path.name.startswith("test_"):
        assert re.search(r"^def test_", path.read_text(), re.M), f"{name} holds no test"
        return
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    users = [p for p in path.parent.glob("test_*.py") if re.search(rf"^from {re.escape(module)} import", p.read_text(), re.M)]
    assert users, f"{name}: no test module beside it imports it, so no lane runs it"


def test_the_included_examples_are_found():
    included = [m.group(1) for _, _, code, _ in PYTHON if (m := INCLUDE.match(code.strip()))]
    assert "tests/integration/testing/test_orders_dag.py" in included, "the include search is broken"


@pytest.mark.parametrize("path, line, code", PYCON, ids=[f"{p.relative_to(ROOT)}:{line}" for p, line, _ in PYCON])
def test_pycon_example_runs(path, line, code):
    test = doctest.DocTestParser().get_doctest(code, {}, f"{path.name}:{line}", str(path), line)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.failures == 0 and runner.tries > 0, f"{path}:{line}: {runner.failures} of {runner.tries} failed"


def slug(heading: str) -> str:
    """GitHub's anchor of a heading (as it renders README.md): lower case, punctuation dropped,
    spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_every_link_in_the_readme_resolves():
    readme = ROOT / "README.md"
    text = re.sub(r"^```.*?^```", "", readme.read_text(), flags=re.M | re.S)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len(links) > 10, "the link search found too few links: it is broken"
    broken = []
    for link in links:
        if re.match(r"[a-z]+://|mailto:", link):
            broken.append(f"{link}: an external link (it cannot be checked offline; link the docs instead)")
            continue
        target, _, anchor = link.partition("#")
        path = (readme.parent / target).resolve() if target else readme
        if not path.is_relative_to(ROOT) or not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and anchor not in anchors(path):
            broken.append(f"{link}: no heading with that anchor in {path.relative_to(ROOT)}")
    assert broken == []


def test_the_readme_anchors_the_code_links_to_exist():
    """The OpenLineage run facet links to a README anchor (its producer URL)."""
    linked = {m for path in sorted((ROOT / "airflow_eo").rglob("*.py"))
              for m in re.findall(r"README\.md#([\w-]+)", path.read_text())}
    assert linked, "no README anchor found in the code: the search is broken, or drop this test"
    assert linked <= anchors(ROOT / "README.md")
