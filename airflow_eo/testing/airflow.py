"""The plugin's Airflow side, every Airflow import of it in this one module: a throw-away Airflow for
the test session, and a user's DAG run through ``dag.test()`` — optionally with a failure injected
at a named protocol step of its ingest, to show the retry keeps the guarantee.

* :func:`isolate_airflow` — ``AIRFLOW_HOME`` in a temporary directory with its own SQLite database,
  set before anything imports ``airflow`` (its configuration is read at import); the plugin does it
  when pytest starts (ini option ``airflow_eo_airflow_home``: ``temp``, the default, or
  ``environment`` to keep the environment's Airflow).
* :func:`migrate` — ``airflow db migrate`` once per session.
* :class:`DagRunner` — ``run(dag)``: the DAG written to the metadata database (a DAG defined in a
  test is in no bundle), ``dag.test()``, then each task's state, try number and XCom.
  ``run(dag, fail_at="before_commit")`` kills the ingest's Spark driver at that point of its first
  attempt (the project's fault points, :mod:`airflow_eo.faults`), once: Airflow's retry runs it again.

Example::

    >>> outcome = runner.run(dag, fail_at="after_stage")                 # doctest: +SKIP
    >>> outcome.state("ingest"), outcome.try_number("ingest"), outcome.fault_fired
    ('success', 2, True)
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow_eo.attempt import Env
from airflow_eo.faults import POINTS, SUBMITTER_POINTS

HOME_MARK = "AIRFLOW_EO_TEST_AIRFLOW_HOME"  # the home isolate_airflow made (so it is made once)
# the points a test may arm: in the Spark driver (spark-submit's own process), never in the task
# process, which dag.test() runs inside pytest: a fault there would kill the test run itself
DRIVER_POINTS = tuple(p for p in POINTS if p not in SUBMITTER_POINTS)
SPARK_CONNECTION = {"conn_type": "spark", "host": "local[2]"}  # spark-submit on this machine


def home_mark() -> str:
    """The variable naming this process's test home: :data:`HOME_MARK`, and in a pytest-xdist worker one of
    its own, so each worker has its own home and SQLite database (the workers inherit the variables of
    the process that started them; two processes writing one SQLite database lock each other out)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return f"{HOME_MARK}_{worker.upper()}" if worker else HOME_MARK


def isolate_airflow(dags_folder: str | None = None) -> str:
    """Point Airflow at a temporary home with its own SQLite database (once per process, and per
    pytest-xdist worker; later calls return the same home). Must run before ``airflow`` is imported;
    the directory goes at exit."""
    mark = home_mark()
    home = os.environ.get(mark)
    if home is None:
        home = tempfile.mkdtemp(prefix="airflow-eo-test-home-")
        atexit.register(shutil.rmtree, home, True)
        os.environ.update({
            mark: home, "AIRFLOW_HOME": home, "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False", "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW__CORE__DAGS_FOLDER": os.path.join(home, "dags"),
        })
    if dags_folder is not None:
        os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = dags_folder
    return home


def migrate() -> None:
    """``airflow db migrate`` (~3 s on SQLite), in a child process with this process's configuration."""
    airflow = Path(sys.executable).parent / "airflow"
    subprocess.run([str(airflow) if airflow.exists() else "airflow", "db", "migrate"], check=True,
                   env=os.environ.copy(), stdout=subprocess.DEVNULL, timeout=300)


def serialise(dag) -> None:
    """A DAG defined in a test is in no bundle (or folder): write it to the metadata database first
    (where and how differs by Airflow version: :mod:`airflow_eo.version_compat`)."""
    from airflow_eo.version_compat import AIRFLOW_V_3_0_PLUS, AIRFLOW_V_3_1_PLUS, AIRFLOW_V_3_2_PLUS

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


def xcom(dag_id: str, run_id: str, task_id: str, key: str = "return_value", map_index: int = -1) -> Any:
    """A task's return value (its XCom), as the metadata database holds it, or None."""
    from airflow_eo.version_compat import task_return_value

    assert key == "return_value", "only return values are read back"
    return task_return_value(dag_id, run_id, task_id, map_index)


def task_states(dag_id: str, run_id: str) -> dict[str, tuple[str, int]]:
    """``{task_id: (state, try_number)}`` of a DAG run (a mapped task: its last map index's)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter_by(dag_id=dag_id, run_id=run_id).all()
        return {ti.task_id: (str(ti.state), ti.try_number) for ti in tis}


def run_dag(dag, **kwargs):
    """``dag.test(**kwargs)`` of a DAG defined anywhere; returns ``(dag_run, {task_id: (state, try_number)})``.
    ``logical_date`` is passed as the installed Airflow names it (``execution_date`` on 2.x)."""
    from airflow_eo.version_compat import dag_test

    serialise(dag)
    dr = dag_test(dag, kwargs.pop("logical_date"), **kwargs) if "logical_date" in kwargs else dag.test(**kwargs)
    return dr, task_states(dag.dag_id, dr.run_id)


@dataclass(frozen=True)
class DagOutcome:
    """What one ``dag.test()`` run left: the run, each task's ``(state, try_number)``, and whether the
    injected fault fired."""

    dag_id: str
    run_id: str
    states: dict[str, tuple[str, int]]
    fault_fired: bool = False
    dag_run: Any = field(default=None, repr=False, compare=False)

    def state(self, task_id: str) -> str:
        return self.states[task_id][0]

    def try_number(self, task_id: str) -> int:
        return self.states[task_id][1]

    def xcom(self, task_id: str, key: str = "return_value", map_index: int = -1) -> Any:
        """The task's XCom: for a ``KafkaToDeltaOperator``, its summary (status, batch, ranges, rows…)."""
        return xcom(self.dag_id, self.run_id, task_id, key, map_index)


class DagRunner:
    """Runs a user's DAG with ``dag.test()`` against the plugin's broker and tables (the ``airflow_dag_runner``
    fixture: the database is migrated, ``kafka_default`` and, when unset, ``spark_default`` are set)."""

    def __init__(self, scratch: Path):
        self.scratch = Path(scratch)

    def run(self, dag, *, task_id: str | None = None, fail_at: str | None = None, **test_kwargs) -> DagOutcome:
        """``dag.test(**test_kwargs)`` (e.g. ``logical_date=...``; Airflow's default: now); with ``task_id``, of
        that task alone (the DAG's ``partial_subset``: its upstream tasks do not run). With ``fail_at``
        (one of :data:`DRIVER_POINTS`), the first ingest attempt that reaches that step is killed
        there like ``kill -9`` (once: the retry is not), so the DAG's ``KafkaToDeltaOperator`` tasks
        need ``retries`` ≥ 1 and a ``spark`` (spark-submit) connection; their retry delay is cut to
        one second for the run. Fails if the fault was armed but never reached."""
        if task_id is not None:
            dag = dag.partial_subset([task_id], include_upstream=False)  # task_ids_or_regex on 2.x
        if fail_at is None:
            dr, states = run_dag(dag, **test_kwargs)
            return DagOutcome(dag.dag_id, dr.run_id, states, dag_run=dr)
        fired, armed = self._arm(dag, fail_at)
        try:
            dr, states = run_dag(dag, **test_kwargs)
        finally:
            for task, env in armed.items():
                task.spark_env_vars = env
        if not fired.exists():
            raise AssertionError(f"the fault at {fail_at!r} was armed but no ingest attempt reached it: the run "
                                 f"read nothing new, or its batch was read without that step ({states})")
        return DagOutcome(dag.dag_id, dr.run_id, states, fault_fired=True, dag_run=dr)

    def _arm(self, dag, point: str) -> tuple[Path, dict]:
        """Arm ``point`` in the Spark jobs of the DAG's ingest tasks only (their ``spark_env_vars``: the
        task process, which is this test process, never sees it); returns the file whose creation
        fires it and each task's environment to restore."""
        from airflow.providers.common.compat.sdk import BaseHook

        from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

        if point not in DRIVER_POINTS:
            raise ValueError(f"fail_at={point!r}: give one of {', '.join(DRIVER_POINTS)} (the steps in the Spark "
                             f"driver; {' and '.join(SUBMITTER_POINTS)} run in the task process, which dag.test() "
                             "runs inside pytest)")
        ingests = [t for t in dag.tasks if isinstance(t, KafkaToDeltaOperator)]
        if not ingests:
            raise ValueError(f"fail_at={point!r}: DAG {dag.dag_id} has no KafkaToDeltaOperator task to inject into")
        for task in ingests:
            if not task.retries:
                raise ValueError(f"fail_at={point!r}: task {task.task_id} has retries=0, so the failure would be "
                                 "final: give it retries=1 or more")
            conn_type = BaseHook.get_connection(task.spark_conn_id).conn_type
            if conn_type != "spark":
                raise ValueError(f"fail_at={point!r}: task {task.task_id}'s connection {task.spark_conn_id!r} is "
                                 f"{conn_type!r}: faults are injected into a spark-submit driver (a 'spark' "
                                 "connection), whose death does not take the test process along")
        fired = Path(tempfile.mkdtemp(prefix="fault-", dir=self.scratch)) / "fired"
        armed = {}
        for task in ingests:
            armed[task] = task.spark_env_vars
            task.spark_env_vars = {**task.spark_env_vars, Env.FAILPOINTS: point, Env.FAILPOINTS_ONCE: str(fired)}
            task.retry_delay = timedelta(seconds=1)
            task.retry_exponential_backoff = False
        return fired, armed
