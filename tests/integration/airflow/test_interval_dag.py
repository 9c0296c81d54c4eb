"""dag.test() of an interval-mode DAG: three logical dates out of order, then one cleared; a run
whose interval is not closed defers until records arrive past its end (or, not deferrable, spends
a retry) — real broker, real spark-submit, real Delta (docs/how-to/interval-mode.md)."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

from deltalake import DeltaTable

from tests.integration.airflow.dagtest import run_dag, serialise, xcom
from tests.conftest import SPARK_CONF
from tests.helpers import duplicates, keys_of, new_topic, read_table
from tests.integration.test_interval_mode import H, _timestamps, hour_base, produce_at

SQL = "SELECT topic, partition, offset, timestamp, CAST(value AS STRING) AS body FROM source"


def interval_dag(topic: str, table: str, dag_id: str = "eo_interval", retries: int = 0, **operator):
    from airflow.sdk import DAG
    from airflow.timetables.interval import DeltaDataIntervalTimetable

    from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

    with DAG(dag_id, schedule=DeltaDataIntervalTimetable(timedelta(hours=1)), start_date=datetime(2026, 1, 1), catchup=False,
             default_args={"retries": retries, "retry_delay": timedelta(seconds=1)}) as dag:
        KafkaToDeltaOperator(task_id="ingest", topics=[topic], table_uri=table, ingest_id="hourly",
                             mode="interval", transform_sql=SQL, spark_conf=SPARK_CONF, **operator)
    return dag


def test_interval_dag_out_of_order_then_cleared(airflow_db, airflow_connections, kafka_config, tmp_path):
    topic, table, base = new_topic(kafka_config, 2), str(tmp_path / "hourly"), hour_base()
    # two records per partition and hour, one of hour 2 sent late (stamped in hour 0), and closers
    records = [(p, base + k * H + 60_000 * (p + 1) * (j + 1)) for k in range(3) for j in range(2) for p in range(2)]
    records.insert(10, (1, base + 30_000))  # after an hour-2 record of p1, stamped in hour 0: late, in hour 2
    produce_at(kafka_config, topic, records + [(0, base + 3 * H + 1), (1, base + 3 * H + 1)])
    dag = interval_dag(topic, table)
    summaries = {}
    # a manual run at X has the data interval [X - 1h, X) (DeltaDataIntervalTimetable): hours 2, 0, 1 in that order
    for hour in (2, 0, 1):
        when = datetime.fromtimestamp((base + (hour + 1) * H) / 1000, tz=timezone.utc)
        dr, states = run_dag(dag, logical_date=when, run_after=when)
        assert states["ingest"][0] == "success", states
        summary = xcom(dag.dag_id, dr.run_id, "ingest")
        assert summary["status"] == "committed" and summary["interval"] == {
            "start_ms": base + hour * H, "end_ms": base + (hour + 1) * H}
        summaries[hour] = (dr.run_id, summary)
    assert [summaries[h][1]["batch"] for h in (2, 0, 1)] == [1, 2, 3]  # batches in run order, not time order
    stamps = _timestamps(kafka_config["bootstrap.servers"], topic, partitions=2)
    rows = read_table(table, ["topic", "partition", "offset", "timestamp"])
    assert duplicates(rows) == {}
    expected = {(topic, p, o) for (p, o), ts in stamps.items() if ts < base + 3 * H}
    assert set(keys_of(rows)) == expected  # each record once: the three hours tile the log
    assert summaries[2][1]["late_records"] == 1 and summaries[0][1]["late_records"] == 0
    assert summaries[2][1]["rows"] == 5 and summaries[0][1]["rows"] == 4
    # clear hour 0's run (dag.test of the same logical date reuses its run id): a no-op without Spark
    version = DeltaTable(table).version()
    when = datetime.fromtimestamp((base + H) / 1000, tz=timezone.utc)
    dr, states = run_dag(dag, logical_date=when, run_after=when)
    assert dr.run_id == summaries[0][0] and states["ingest"][0] == "success"
    again = xcom(dag.dag_id, dr.run_id, "ingest")
    assert again["status"] == "already_committed" and again["batch"] == 2 and not again["spark_started"]
    assert DeltaTable(table).version() == version


def deferred(dag_id: str) -> bool:
    """Whether the run's ingest task has deferred (the execution API recorded its next method)."""
    from sqlalchemy.exc import OperationalError

    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    try:
        with create_session() as session:
            return session.query(TaskInstance).filter_by(dag_id=dag_id, task_id="ingest",
                                                         next_method="execute_complete").count() > 0
    except OperationalError:  # SQLite busy while the task writes: ask again
        return False


def test_an_open_interval_defers_and_commits_once_when_records_pass_its_end(airflow_db, airflow_connections,
                                                                             kafka_config, tmp_path):
    topic, table, base = new_topic(kafka_config, 2), str(tmp_path / "hourly"), hour_base()
    produce_at(kafka_config, topic, [(p, base + 60_000 * (j + 1) + p) for j in range(2) for p in range(2)])
    # close_after far away: only records past the end close the interval
    dag = interval_dag(topic, table, "eo_interval_deferred", deferrable=True, poll_interval=1, close_after="10d")
    seen: dict[str, float] = {}

    def close_when_deferred():  # the trigger runs inline in dag.test(): close the interval from here
        deadline = time.monotonic() + 300
        while not deferred(dag.dag_id):
            if time.monotonic() > deadline:
                return  # never deferred: the run stays open and the test fails below
            time.sleep(0.2)
        seen["deferred"] = time.monotonic()
        time.sleep(2)  # the trigger checks (and finds it open) at least once more
        produce_at(kafka_config, topic, [(0, base + H + 1)])
        time.sleep(2)  # one partition past the end is not enough
        produce_at(kafka_config, topic, [(1, base + H + 2)])

    # Airflow's modules imported and its ORM configured here first: a thread that imports them while
    # dag.test() does deadlocks on the import and mapper locks
    serialise(dag)
    assert not deferred(dag.dag_id)
    closer = threading.Thread(target=close_when_deferred, daemon=True)
    closer.start()
    when = datetime.fromtimestamp((base + H) / 1000, tz=timezone.utc)  # the data interval [base, base + 1h)
    dr, states = run_dag(dag, logical_date=when, run_after=when)
    closer.join(10)
    assert "deferred" in seen, "the task never deferred"
    assert states["ingest"] == ("success", 1), states  # no retry was spent on the wait
    summary = xcom(dag.dag_id, dr.run_id, "ingest")
    assert (summary["status"], summary["batch"], summary["rows"]) == ("committed", 1, 4)
    assert summary["interval"] == {"start_ms": base, "end_ms": base + H}
    history = DeltaTable(table).history()
    assert sum(1 for c in history if "airflow_eo.batch" in c) == 1  # one commit of the batch
    rows = read_table(table, ["topic", "partition", "offset", "timestamp"])
    # each record of the interval once; the closers (offset 2) belong to the next interval
    assert duplicates(rows) == {} and {k[1:] for k in keys_of(rows)} == {(0, 0), (0, 1), (1, 0), (1, 1)}


def test_not_deferrable_an_open_interval_spends_a_retry_as_before(airflow_db, airflow_connections, kafka_config,
                                                                   tmp_path):
    topic, table, base = new_topic(kafka_config, 1), str(tmp_path / "hourly"), hour_base()
    produce_at(kafka_config, topic, [(0, base + 60_000), (0, base + 120_000)])

    def close_it(context):  # between the failed try and its retry
        produce_at(kafka_config, topic, [(0, base + H + 1)])

    dag = interval_dag(topic, table, "eo_interval_retried", retries=1, deferrable=False, close_after="10d",
                       on_retry_callback=close_it)
    when = datetime.fromtimestamp((base + H) / 1000, tz=timezone.utc)
    dr, states = run_dag(dag, logical_date=when, run_after=when)
    assert states["ingest"] == ("success", 2), states  # the first try failed with IntervalNotClosedError
    assert not deferred(dag.dag_id)
    summary = xcom(dag.dag_id, dr.run_id, "ingest")
    assert (summary["status"], summary["batch"], summary["rows"]) == ("committed", 1, 2)
