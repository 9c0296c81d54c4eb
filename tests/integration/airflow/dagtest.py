"""Running DAGs in-process with ``dag.test()`` and reading back what Airflow recorded, on every
supported Airflow (2.11, 3.0–3.3): the pytest plugin's (airflow_eo/testing/airflow.py), which users'
DAG tests use too, and the Asset (Dataset) events a run left."""

from __future__ import annotations

from airflow_eo.testing.airflow import run_dag, serialise, xcom  # noqa: F401 - the DAG tests' vocabulary
from airflow_eo.version_compat import AIRFLOW_V_3_0_PLUS


def asset_events(uri: str) -> list[tuple[dict, str | None]]:
    """(extra, source run id) of each event on the Asset (a Dataset on Airflow 2) ``uri``, oldest first."""
    from airflow.utils.session import create_session

    with create_session() as session:
        if AIRFLOW_V_3_0_PLUS:
            from airflow.models.asset import AssetEvent as Event, AssetModel as Model

            target = Event.asset_id
        else:
            from airflow.models.dataset import DatasetEvent as Event, DatasetModel as Model

            target = Event.dataset_id
        rows = (session.query(Event.extra, Event.source_run_id).join(Model, target == Model.id)
                .filter(Model.uri == uri).order_by(Event.id).all())
        return [(dict(extra or {}), run_id) for extra, run_id in rows]
