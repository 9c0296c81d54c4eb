"""airflow-eo's pytest plugin and test helpers (extra ``testing``): test a DAG that ingests with airflow-eo.

The fixtures are in :mod:`airflow_eo.testing.plugin` (pytest loads it through the ``pytest11``
entry point); the assertions and helpers are importable from here, each loaded when first used::

    from airflow_eo.testing import assert_exactly_once, assert_last_write_per_key, read_table

Guide and a complete example: docs/how-to/testing.md.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> module: imported on first use, so importing the plugin stays light
_EXPORTS = {
    "assert_exactly_once": "assertions", "assert_offsets_at_end": "assertions",
    "assert_no_aborted_records": "assertions", "assert_last_write_per_key": "assertions",
    "expected_rows": "assertions", "TableCheck": "assertions",
    "TestBroker": "kafka", "Record": "kafka",
    "TestTable": "tables", "read_table": "tables", "rows": "tables",
    "DagRunner": "airflow", "DagOutcome": "airflow", "run_dag": "airflow",
    "RegistryDouble": "registry", "MotoS3": "s3",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
