"""Example: a scheduled ingestion, sensor → ingest (airflow-eo).

Waits in the triggerer until the topic holds new records for the table, then ingests
them exactly once. Runs unchanged against the embedded broker of ``airflow-eo demo``:
set the connection ``kafka_default`` (e.g. ``AIRFLOW_CONN_KAFKA_DEFAULT='{"conn_type":
"kafka", "extra": {"bootstrap.servers": "127.0.0.1:9092"}}'``) and ``spark_default``
(``'{"conn_type": "spark", "host": "local[2]"}'``). The table and topic come from
``AIRFLOW_EO_TABLE_URI`` / ``AIRFLOW_EO_TOPIC`` when the DAG file is parsed.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

# common-compat's names: the example runs unchanged on Airflow 2.11 and 3.x (on 3.x alone: airflow.sdk)
from airflow.providers.common.compat.sdk import DAG, Param

from airflow_eo.attempt import Env
from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator
from airflow_eo.sensors.kafka_backlog import KafkaBacklogSensor

TABLE_URI = os.environ.get(Env.EXAMPLE_TABLE_URI, "/tmp/airflow-eo-demo/orders")
TOPIC = os.environ.get(Env.EXAMPLE_TOPIC, "orders")

with DAG(
    dag_id="kafka_to_delta_scheduled",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30)},
    # Airflow 3's Clear takes no conf: to replace a past run's rows, backfill its date with
    # reprocess_behavior="completed" and conf {"reprocess": true} (docs/how-to/reruns.md)
    params={"reprocess": Param(False, type="boolean",
                               description="re-read this run's committed ranges and replace its rows "
                                           "(set in the conf of a backfill with reprocess_behavior)")},
    tags=["airflow-eo", "example"],
) as dag:
    wait = KafkaBacklogSensor(
        task_id="wait_for_records", topics=[TOPIC], table_uri=TABLE_URI, ingest_id="orders",
        min_records=1, poke_interval=10, timeout=600, soft_fail=True,
    )
    ingest = KafkaToDeltaOperator(
        task_id="ingest", topics=[TOPIC], table_uri=TABLE_URI, ingest_id="orders",
        transform_sql="SELECT topic, partition, offset, timestamp, CAST(key AS STRING) AS key, "
                      "CAST(value AS STRING) AS body FROM source",
        max_records_per_run=100_000,
        spark_conf={"spark.ui.enabled": "false"},
    )
    wait >> ingest
