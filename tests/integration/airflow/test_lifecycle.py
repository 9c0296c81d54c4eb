"""One ingest table's life through ``dag.test()``, on every supported Airflow (2.11, 3.0–3.3).

The Airflow lane of each older Airflow in ``.ci/run`` runs this module (the newest runs it with
the rest of the integration lane): the real embedded broker, real spark-submit through
SparkSubmitHook (``spark_default`` = local[2]), a real Delta table, and Airflow's own
metadata DB. In file order, building on each other: a committed run and the table's Asset
(Dataset on 2.11) event with the run's summary as extra; a clear of that run, which is a no-op
without Spark; a reprocess of it through the DAG's params (``run_conf``); the backlog sensor
deferring, resuming in the (inline) triggerer and the ingest taking the backlog; and, on a table
of its own, an interval-mode run that ingests exactly its run's data interval. Between them, a run a
retry cannot fix fails at once, its retries unspent. (The older Airflows' lane also runs
tests/integration/operators/test_errors_metrics_lineage.py: errors, metrics and OpenLineage.)
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from deltalake import DeltaTable

from airflow_eo.version_compat import asset_event_extra
from tests.conftest import SPARK_CONF
from tests.helpers import broker_records, duplicates, keys_of, new_topic, produce, read_table
from tests.integration.airflow.dagtest import asset_events, run_dag, xcom
from tests.integration.test_interval_mode import H, _timestamps, hour_base, produce_at

D1 = datetime(2026, 3, 1, tzinfo=timezone.utc)
SQL = "SELECT topic, partition, offset, CAST(value AS STRING) AS body FROM source"


@pytest.fixture(scope="module")
def world(airflow_db, airflow_connections, kafka_config, tmp_path_factory):
    return {"topic": new_topic(kafka_config, 2), "table": str(tmp_path_factory.mktemp("lifecycle") / "orders")}


def lifecycle_dag(world, dag_id="eo_lifecycle", sensor_min_records=None, retries=0):
    """The README's DAG: (sensor →) ingest, with the ``reprocess`` params a run's conf sets."""
    from airflow.providers.common.compat.sdk import DAG, Param

    from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator
    from airflow_eo.sensors.kafka_backlog import KafkaBacklogSensor

    with DAG(dag_id, schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False,
             default_args={"retries": retries, "retry_delay": timedelta(seconds=1)}, params={"reprocess": Param(False, type="boolean"), "reprocess_run_id": Param("", type="string")}) as dag:
        ingest = KafkaToDeltaOperator(task_id="ingest", topics=[world["topic"]], table_uri=world["table"],
                                      ingest_id="orders", transform_sql=SQL, spark_conf=SPARK_CONF)
        if sensor_min_records is not None:
            KafkaBacklogSensor(task_id="wait", topics=[world["topic"]], table_uri=world["table"], ingest_id="orders",
                               min_records=sensor_min_records, poke_interval=1, timeout=240) >> ingest
    return dag


def table_uri_of_asset(table: str) -> str:
    from airflow_eo.operators.kafka_to_delta import table_asset

    return table_asset(table).uri


def assert_exactly_once(world, kafka_config, expected_rows):
    table = read_table(world["table"])
    assert duplicates(table) == {} and table.num_rows == expected_rows
    assert set(keys_of(table)) == set(broker_records(kafka_config["bootstrap.servers"], world["topic"]))


def test_a_committed_run_emits_the_table_event_with_its_summary(world, kafka_config):
    produce(kafka_config, world["topic"], 20, partitions=2)
    dr, states = run_dag(lifecycle_dag(world), logical_date=D1)
    assert states["ingest"] == ("success", 1), states
    summary = xcom("eo_lifecycle", dr.run_id, "ingest")
    assert (summary["status"], summary["batch"], summary["rows"]) == ("committed", 1, 20)
    assert summary["run_key"] == f"eo_lifecycle/{dr.run_id}/ingest/-1"
    assert_exactly_once(world, kafka_config, 20)
    # through the operator's alias, on the table's Asset (Dataset), the summary as extra (on 2.11 its
    # nested values as JSON text: Airflow 2 needs hashable values there)
    assert asset_events(table_uri_of_asset(world["table"])) == [(asset_event_extra(summary), dr.run_id)]
    world["first"] = (dr.run_id, summary)


def test_a_clear_of_the_committed_run_is_a_noop_without_spark(world, kafka_config):
    run_id, first = world["first"]
    version = DeltaTable(world["table"]).version()
    produce(kafka_config, world["topic"], 5, partitions=2, start=20)  # must NOT be taken by the cleared run
    # dag.test() of the same logical date replaces the run by one of the same run id: what a clear does
    dr, states = run_dag(lifecycle_dag(world), logical_date=D1)
    assert dr.run_id == run_id and states["ingest"] == ("success", 1), states
    again = xcom("eo_lifecycle", run_id, "ingest")
    assert (again["status"], again["batch"], again["spark_started"]) == ("already_committed", 1, False)
    assert DeltaTable(world["table"]).version() == version
    assert len(asset_events(table_uri_of_asset(world["table"]))) == 1  # a replay changes nothing: no event


def test_a_reprocess_through_params_replaces_that_runs_rows(world, kafka_config):
    run_id, first = world["first"]
    before = read_table(world["table"])
    dr, states = run_dag(lifecycle_dag(world), logical_date=D1 + timedelta(days=1),
                         run_conf={"reprocess": True, "reprocess_run_id": run_id})
    assert states["ingest"] == ("success", 1), states
    summary = xcom("eo_lifecycle", dr.run_id, "ingest")
    assert (summary["status"], summary["batch"]) == ("reprocessed", 1)
    assert summary["ranges"] == first["ranges"] and summary["rows"] == first["rows"]
    after = read_table(world["table"])
    assert duplicates(after) == {} and set(keys_of(after)) == set(keys_of(before))
    events = asset_events(table_uri_of_asset(world["table"]))
    assert len(events) == 2 and events[-1] == (asset_event_extra(summary), dr.run_id)  # a reprocess changed the table


def test_a_run_a_retry_cannot_fix_fails_without_spending_its_retries(world):
    """Reprocessing a run that never committed: nothing to reprocess (AirflowFailException), no Spark."""
    dag = lifecycle_dag(world, dag_id="eo_lifecycle_fail_fast", retries=2)
    dr, states = run_dag(dag, logical_date=D1, run_conf={"reprocess": True, "reprocess_run_id": "never_ran"})
    assert states["ingest"] == ("failed", 1), states
    assert xcom(dag.dag_id, dr.run_id, "ingest") is None


def test_the_sensor_defers_resumes_and_the_ingest_takes_the_backlog(world, kafka_config, monkeypatch):
    import airflow_eo.triggers.kafka_backlog as trigger_module

    waiting = 5  # produced by the clear's test, not ingested since
    dag = lifecycle_dag(world, dag_id="eo_lifecycle_sensor", sensor_min_records=waiting + 3)
    measured = []  # by the trigger: dag.test() runs it inline, in this process, once the sensor deferred

    def measure_in_trigger(*args, **kwargs):
        backlog = real(*args, **kwargs)
        measured.append(sum(backlog.values()))
        if len(measured) == 2:  # the trigger found too few twice: the records arrive now
            produce(kafka_config, world["topic"], 3, partitions=2, start=25)
        return backlog

    real = trigger_module.measure_backlog
    monkeypatch.setattr(trigger_module, "measure_backlog", measure_in_trigger)
    dr, states = run_dag(dag, logical_date=D1)
    assert measured[:2] == [waiting, waiting] and measured[-1] == waiting + 3, measured  # deferred, then resumed
    assert states["wait"] == ("success", 1) and states["ingest"] == ("success", 1), states
    backlog = xcom(dag.dag_id, dr.run_id, "wait")  # what execute_complete returned from the trigger's event
    assert sum(backlog.values()) == waiting + 3
    summary = xcom(dag.dag_id, dr.run_id, "ingest")
    assert (summary["status"], summary["batch"], summary["rows"]) == ("committed", 2, waiting + 3)
    assert_exactly_once(world, kafka_config, 20 + waiting + 3)


def test_an_interval_mode_run_ingests_exactly_its_data_interval(airflow_db, airflow_connections, kafka_config,
                                                               tmp_path):
    from airflow.providers.common.compat.sdk import DAG
    from airflow.timetables.interval import DeltaDataIntervalTimetable

    from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

    topic, table, base = new_topic(kafka_config, 2), str(tmp_path / "hourly"), hour_base()
    # two records per partition in each of hours 0-2, then one past hour 3 per partition: closed
    produce_at(kafka_config, topic, [(p, base + k * H + 60_000 * (j + 1) + p) for k in range(3) for j in range(2)
                                     for p in range(2)] + [(0, base + 3 * H + 1), (1, base + 3 * H + 1)])
    with DAG("eo_lifecycle_interval", schedule=DeltaDataIntervalTimetable(timedelta(hours=1)),
             start_date=datetime(2026, 1, 1), catchup=False) as dag:
        KafkaToDeltaOperator(task_id="ingest", topics=[topic], table_uri=table, ingest_id="hourly", mode="interval",
                             transform_sql=SQL.replace("offset,", "offset, timestamp,"), spark_conf=SPARK_CONF)
    when = datetime.fromtimestamp((base + 2 * H) / 1000, tz=timezone.utc)
    dr, states = run_dag(dag, logical_date=when)
    assert states["ingest"] == ("success", 1), states
    # the run's data interval as this Airflow gave it (3.x: [X - 1h, X); 2.11: [X, X + 1h)), one hour
    start_ms, end_ms = (int(dr.data_interval_start.timestamp() * 1000), int(dr.data_interval_end.timestamp() * 1000))
    assert end_ms - start_ms == H and start_ms in (base + H, base + 2 * H)
    summary = xcom(dag.dag_id, dr.run_id, "ingest")
    assert summary["status"] == "committed" and summary["interval"] == {"start_ms": start_ms, "end_ms": end_ms}
    stamps = _timestamps(kafka_config["bootstrap.servers"], topic, partitions=2)
    rows = read_table(table, ["topic", "partition", "offset", "timestamp"])
    assert duplicates(rows) == {} and summary["rows"] == rows.num_rows == 4
    assert set(keys_of(rows)) == {(topic, p, o) for (p, o), ts in stamps.items() if start_ms <= ts < end_ms}
