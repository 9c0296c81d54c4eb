"""Running DAGs in-process with ``dag.test()`` and reading back what Airflow recorded."""

from __future__ import annotations

import json


def serialise(dag) -> None:
    """A DAG defined in a test is not in any bundle: write it to the metadata DB first."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(collect_dags=False)
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)


def run_dag(dag, **kwargs):
    """``dag.test(**kwargs)``; returns ``(dag_run, {task_id: state})``."""
    serialise(dag)
    dr = dag.test(**kwargs)
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter_by(dag_id=dag.dag_id, run_id=dr.run_id).all()
        states = {ti.task_id: (str(ti.state), ti.try_number) for ti in tis}
    return dr, states


def xcom(dag_id: str, run_id: str, task_id: str, key: str = "return_value", map_index: int = -1):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.query(XComModel).filter_by(dag_id=dag_id, run_id=run_id, task_id=task_id, key=key,
                                                 map_index=map_index).one_or_none()
        if row is None:
            return None
        value = row.value
        return json.loads(value) if isinstance(value, str) else value
