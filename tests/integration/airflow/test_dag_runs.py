"""dag.test() runs of KafkaToDeltaOperator: real broker, real spark-submit (SparkSubmitHook,
``spark_default`` = local[2]) and a real Delta table, in the order a DAG lives through them.

One module-scoped topic and table; the tests run in file order and build on each other:
a scheduled run, a manual run (logical_date None), a clear of the first run (no Spark),
a reprocess of the first run, and a run whose first try crashes before its commit. Last, a
mapped ingest of two tables of their own.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import pytest
from deltalake import DeltaTable

from airflow_eo.core.offsets import TopicPartition
from airflow_eo.table.ledger import Ledger
from tests.conftest import SPARK_CONF
from tests.integration.airflow.dagtest import run_dag, xcom
from tests.helpers import broker_records, duplicates, keys_of, new_topic, produce, read_table

D1 = datetime(2026, 3, 1, tzinfo=timezone.utc)
SQL = "SELECT topic, partition, offset, CAST(value AS STRING) AS body FROM source"
UPPER_SQL = "SELECT topic, partition, offset, upper(CAST(value AS STRING)) AS body FROM source"


@pytest.fixture(scope="module")
def world(airflow_db, airflow_connections, kafka_config, tmp_path_factory):
    topic = new_topic(kafka_config)
    return {"topic": topic, "table": str(tmp_path_factory.mktemp("dagtest") / "orders"), "runs": {}}


def ingest_dag(world, dag_id="eo_ingest", **op_kwargs):
    from airflow.sdk import DAG

    from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

    with DAG(dag_id, schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False,
             default_args={"retries": 1, "retry_delay": timedelta(seconds=1)}) as dag:
        KafkaToDeltaOperator(task_id="ingest", topics=[world["topic"]], table_uri=world["table"], ingest_id="orders",
                             transform_sql=op_kwargs.pop("transform_sql", SQL), spark_conf=SPARK_CONF, **op_kwargs)
    return dag


def attempts(table):
    path = os.path.join(table, "_airflow_eo", "attempts")
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def assert_summary_matches_log(summary, table):
    record = Ledger.open(table).find_batch("orders", attempt_id=summary["attempt_id"])
    assert record is not None and record.meta.batch == summary["batch"] and record.version == summary["version"]
    assert [r.__dict__ for r in record.meta.ranges if r.end > r.start] == summary["ranges"]
    assert record.meta.rows == summary["rows"]


def assert_exactly_once(world, kafka_config):
    table = read_table(world["table"])
    assert duplicates(table) == {}
    assert set(keys_of(table)) == set(broker_records(kafka_config["bootstrap.servers"], world["topic"]))


def test_scheduled_then_manual_run_take_consecutive_ranges(world, kafka_config):
    produce(kafka_config, world["topic"], 30)
    dag = ingest_dag(world)
    dr, states = run_dag(dag, logical_date=D1, run_after=D1)
    assert states["ingest"][0] == "success"
    first = xcom(dag.dag_id, dr.run_id, "ingest")
    assert first["status"] == "committed" and first["batch"] == 1 and first["rows"] == 30
    assert first["run_key"] == f"eo_ingest/{dr.run_id}/ingest/-1"
    assert_summary_matches_log(first, world["table"])
    world["runs"]["first"] = (dr.run_id, first)

    produce(kafka_config, world["topic"], 12, start=30)
    dr2, states = run_dag(dag, logical_date=None)  # a manual run: no logical date, no data interval
    assert dr2.logical_date is None and states["ingest"][0] == "success"
    second = xcom(dag.dag_id, dr2.run_id, "ingest")
    assert second["status"] == "committed" and second["batch"] == 2 and second["rows"] == 12
    assert {(r["partition"], r["start"]) for r in second["ranges"]} == \
        {(r["partition"], r["end"]) for r in first["ranges"]}
    assert_summary_matches_log(second, world["table"])
    assert_exactly_once(world, kafka_config)


def test_clear_of_successful_run_is_a_noop_without_spark(world, kafka_config):
    run_id, first = world["runs"]["first"]
    before_attempts, before_version = attempts(world["table"]), DeltaTable(world["table"]).version()
    produce(kafka_config, world["topic"], 6, start=42)  # new data must NOT be taken by the cleared run
    # dag.test replaces the run of that logical date by one with the same run_id: a clear
    dr, states = run_dag(ingest_dag(world), logical_date=D1, run_after=D1)
    assert dr.run_id == run_id and states["ingest"][0] == "success"
    summary = xcom("eo_ingest", run_id, "ingest")
    assert summary["status"] == "already_committed" and summary["batch"] == first["batch"]
    assert summary["spark_started"] is False
    assert attempts(world["table"]) == before_attempts  # no attempt = no spark-submit started
    assert DeltaTable(world["table"]).version() == before_version


def test_reprocess_of_past_run_replaces_only_its_rows(world, kafka_config):
    run_id, first = world["runs"]["first"]
    partitions = [TopicPartition(r["topic"], r["partition"]) for r in first["ranges"]]
    offsets = Ledger.open(world["table"]).committed_offsets("orders", partitions)
    before = read_table(world["table"])
    dag = ingest_dag(world, dag_id="eo_reprocess", transform_sql=UPPER_SQL, reprocess=True,
                     reprocess_dag_id="eo_ingest", reprocess_run_id=run_id)
    dr, states = run_dag(dag, logical_date=None)
    assert states["ingest"][0] == "success"
    summary = xcom("eo_reprocess", dr.run_id, "ingest")
    assert summary["status"] == "reprocessed" and summary["batch"] == first["batch"]
    assert summary["ranges"] == first["ranges"] and summary["rows"] == first["rows"]
    table = read_table(world["table"])
    assert duplicates(table) == {} and table.num_rows == before.num_rows
    bodies = dict(zip(keys_of(table), table["body"].to_pylist()))
    upper = {k for k, v in bodies.items() if v.startswith("V")}
    assert len(upper) == first["rows"] == 30
    assert Ledger.open(world["table"]).last_batch("orders") == 2
    assert Ledger.open(world["table"]).committed_offsets("orders", partitions) == offsets  # no offset moved


def test_crash_of_first_try_then_retry_replays_the_same_plan(world, kafka_config):
    dag = ingest_dag(world, dag_id="eo_ingest", spark_env_vars={
        "AIRFLOW_EO_FAILPOINTS": "{{ 'before_commit' if ti.try_number == 1 else '' }}"})
    before = set(attempts(world["table"]))
    dr, states = run_dag(dag, logical_date=D1 + timedelta(days=1))
    assert states["ingest"] == ("success", 2)
    summary = xcom("eo_ingest", dr.run_id, "ingest")
    assert summary["status"] == "committed" and summary["batch"] == 3 and summary["rows"] == 6
    # the crashed attempt ended without a commit: the retry collected its marker and files
    # and committed the same logged plan in one attempt of its own
    new = set(attempts(world["table"])) - before
    assert new == {summary["attempt_id"] + ".json"}
    assert_summary_matches_log(summary, world["table"])
    assert_exactly_once(world, kafka_config)


def test_mapped_ingest_of_two_tables_commits_each_table_once(world, kafka_config, tmp_path):
    """One mapped task over two tables (``expand_kwargs``): each map index ingests its own
    topic into its own table, with its own run key. Nothing limits the task to one instance
    per DAG: runs of one table take turns (the table wait) and the commit is compare-and-set per
    table, so the scheduler may run both at once."""
    from airflow.sdk import DAG

    from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

    tables = [{"topics": [new_topic(kafka_config, 2)], "table_uri": str(tmp_path / name), "ingest_id": name}
              for name in ("orders", "payments")]
    for i, kwargs in enumerate(tables):
        produce(kafka_config, kwargs["topics"][0], 20 + i, partitions=2)
    with DAG("eo_mapped", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
        KafkaToDeltaOperator.partial(task_id="ingest", transform_sql=SQL, spark_conf=SPARK_CONF) \
            .expand_kwargs(tables)
    dr, states = run_dag(dag, logical_date=None)
    assert states["ingest"][0] == "success"
    summaries = [xcom("eo_mapped", dr.run_id, "ingest", map_index=i) for i in range(len(tables))]
    assert [s["status"] for s in summaries] == ["committed", "committed"], summaries
    for index, (kwargs, summary) in enumerate(zip(tables, summaries)):
        assert summary["rows"] == 20 + index and summary["run_key"] == f"eo_mapped/{dr.run_id}/ingest/{index}"
        record = Ledger.open(kwargs["table_uri"]).find_batch(kwargs["ingest_id"], attempt_id=summary["attempt_id"])
        assert record is not None and record.meta.rows == summary["rows"]
        table = read_table(kwargs["table_uri"])
        assert duplicates(table) == {}
        assert set(keys_of(table)) == set(broker_records(kafka_config["bootstrap.servers"], kwargs["topics"][0]))


def test_a_fan_out_task_commits_each_sink_and_emits_each_tables_asset_event(world, kafka_config, tmp_path):
    """``sinks`` through Airflow: the DAG (sinks serialised as a template field) runs one spark-submit
    that writes a raw table and a merge table; the XCom lists both; each table's Asset gets its event
    through the task's alias, and a run with nothing new emits none."""
    from airflow.sdk import DAG

    from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator
    from tests.integration.airflow.dagtest import asset_events

    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 16, partitions=2)
    raw, latest = str(tmp_path / "fan_raw"), str(tmp_path / "fan_latest")
    with DAG("eo_fan", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
        KafkaToDeltaOperator(task_id="ingest", topics=[topic], ingest_id="fan", spark_conf=SPARK_CONF, sinks=[
            {"table_uri": raw, "transform_sql": SQL},
            {"table_uri": latest, "write_mode": "merge", "merge_key": "p",
             "transform_sql": "SELECT partition AS p, topic, partition, offset FROM source"}])
    dr, states = run_dag(dag, logical_date=None)
    assert states["ingest"][0] == "success"
    summary = xcom("eo_fan", dr.run_id, "ingest")
    assert summary["status"] == "committed" and summary["table_uris"] == sorted([raw, latest])
    assert {t["table_uri"]: (t["status"], t["rows"]) for t in summary["tables"]} == \
        {raw: ("committed", 16), latest: ("committed", 2)}
    assert read_table(raw).num_rows == 16 and duplicates(read_table(raw)) == {} and read_table(latest).num_rows == 2
    for table in (raw, latest):
        (event,) = asset_events(f"file://{table}")
        assert event[1] == dr.run_id and event[0]["status"] == "committed"

    dr2, states = run_dag(dag, logical_date=None)
    assert states["ingest"][0] == "success"
    assert {t["status"] for t in xcom("eo_fan", dr2.run_id, "ingest")["tables"]} == {"nothing_new"}
    assert [len(asset_events(f"file://{t}")) for t in (raw, latest)] == [1, 1]
