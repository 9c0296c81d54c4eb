"""dag.test() of an interval-mode DAG: three logical dates out of order, then one cleared — real
broker, real spark-submit, real Delta (docs/how-to/interval-mode.md)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from deltalake import DeltaTable

from tests.integration.airflow.dagtest import run_dag, xcom
from tests.conftest import SPARK_CONF
from tests.helpers import duplicates, keys_of, new_topic, read_table
from tests.integration.test_interval_mode import H, _timestamps, hour_base, produce_at

SQL = "SELECT topic, partition, offset, timestamp, CAST(value AS STRING) AS body FROM source"


def interval_dag(topic: str, table: str):
    from airflow.sdk import DAG
    from airflow.timetables.interval import DeltaDataIntervalTimetable

    from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

    with DAG("eo_interval", schedule=DeltaDataIntervalTimetable(timedelta(hours=1)), start_date=datetime(2026, 1, 1), catchup=False,
             default_args={"retries": 0}) as dag:
        KafkaToDeltaOperator(task_id="ingest", topics=[topic], table_uri=table, ingest_id="hourly",
                             mode="interval", transform_sql=SQL, spark_conf=SPARK_CONF)
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
