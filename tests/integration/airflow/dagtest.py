"""Running DAGs in-process with ``dag.test()`` and reading back what Airflow recorded: the pytest
plugin's (airflow_eo/testing/airflow.py), which users' DAG tests use too."""

from __future__ import annotations

from airflow_eo.testing.airflow import run_dag, serialise, xcom  # noqa: F401 - the DAG tests' vocabulary
