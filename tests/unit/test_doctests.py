"""The docstring examples of the modules without I/O run as doctests: an example that drifts
from the code fails here. (Examples that need Kafka, Spark or a table are marked +SKIP.)"""

from __future__ import annotations

import doctest
import importlib

import pytest

PURE_MODULES = [
    "airflow_eo.core.planning", "airflow_eo.core.intervals", "airflow_eo.core.offsets", "airflow_eo.core.errors", "airflow_eo.attempt",
    "airflow_eo.spec", "airflow_eo.spec.parts", "airflow_eo.spec.columns", "airflow_eo.loop.config", "airflow_eo.decoding.avro_types",
    "airflow_eo.decoding.avro", "airflow_eo.decoding.decoder", "airflow_eo.table.metadata",
    "airflow_eo.table.partitioning", "airflow_eo.table.storage", "airflow_eo.table.history", "airflow_eo.ui.tables",
    "airflow_eo.ui.charts", "airflow_eo.ui.render", "airflow_eo.audit.findings", "airflow_eo.driver.source",
    "airflow_eo.driver.direct", "airflow_eo.spec.halves", "airflow_eo.sinks.registry",
]


@pytest.mark.parametrize("name", PURE_MODULES)
def test_the_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, report=True)
    assert result.attempted > 0, f"{name} has no example that runs: drop it from PURE_MODULES or add one"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed (see above)"
