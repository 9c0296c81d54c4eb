"""Running DAGs in-process with ``dag.test()`` and reading back what Airflow recorded, on every
supported Airflow (2.11, 3.0–3.3: the differences are named by :mod:`airflow_eo.version_compat`)."""

from __future__ import annotations

from airflow_eo.version_compat import (
    AIRFLOW_V_3_0_PLUS, AIRFLOW_V_3_1_PLUS, AIRFLOW_V_3_2_PLUS, dag_test, task_return_value,
)


def serialise(dag) -> None:
    """A DAG defined in a test is not in any bundle (or folder): write it to the metadata DB first."""
    if AIRFLOW_V_3_1_PLUS:
        from airflow.dag_processing.bundles.manager import DagBundlesManager

        if AIRFLOW_V_3_2_PLUS:
            from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
        else:  # 3.1: the same two, in airflow.models
            from airflow.models.dagbag import DagBag, sync_bag_to_db

        DagBundlesManager().sync_bundles_to_db()
        bag = DagBag(collect_dags=False)
        bag.bag_dag(dag)
        sync_bag_to_db(bag, "dags-folder", None)
    elif AIRFLOW_V_3_0_PLUS:
        from airflow.dag_processing.bundles.manager import DagBundlesManager
        from airflow.models.dagbag import DagBag

        DagBundlesManager().sync_bundles_to_db()
        if dag.relative_fileloc is None:  # set by 3.0's DagBag when it parses a file (as here: no bundle path)
            dag.relative_fileloc = dag.fileloc
        bag = DagBag(collect_dags=False)
        bag.bag_dag(dag)
        bag.sync_to_db("dags-folder", None)
    else:
        from airflow.models.dagbag import DagBag

        bag = DagBag(collect_dags=False)
        bag.bag_dag(dag, root_dag=dag)
        bag.sync_to_db()


def run_dag(dag, **kwargs):
    """``dag.test(**kwargs)``; returns ``(dag_run, {task_id: (state, try_number)})``. ``logical_date``
    (with Airflow 3's ``run_after`` defaulting to it) is passed as the installed Airflow names it."""
    serialise(dag)
    if "logical_date" in kwargs:
        dr = dag_test(dag, kwargs.pop("logical_date"), **kwargs)
    else:
        dr = dag.test(**kwargs)
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter_by(dag_id=dag.dag_id, run_id=dr.run_id).all()
        states = {ti.task_id: (str(ti.state), ti.try_number) for ti in tis}
    return dr, states


def xcom(dag_id: str, run_id: str, task_id: str, key: str = "return_value", map_index: int = -1):
    assert key == "return_value", "only return values are read back"
    return task_return_value(dag_id, run_id, task_id, map_index)


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

