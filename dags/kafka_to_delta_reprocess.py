"""Example: reprocess a past run of ``kafka_to_delta_scheduled`` (airflow-eo).

Trigger it with the run id to reprocess, e.g. from the UI or::

    airflow dags trigger kafka_to_delta_reprocess --conf '{"reprocess_run_id": "scheduled__2026-01-01T01:00:00+00:00"}'

It re-reads exactly the offsets that run ingested (from the plan logged in the table)
and replaces that run's rows in one Delta commit; offsets and other rows do not change.
The same happens when you backfill that run's date in ``kafka_to_delta_scheduled`` with
``reprocess_behavior="completed"`` and the run conf ``{"reprocess": true}`` (Airflow 3's clear
takes no conf). Needs the same connections and environment as that DAG.
"""

from __future__ import annotations

import os
from datetime import datetime

# common-compat's names: the example runs unchanged on Airflow 2.11 and 3.x (on 3.x alone: airflow.sdk)
from airflow.providers.common.compat.sdk import DAG, Param

from airflow_eo.attempt import Env
from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

TABLE_URI = os.environ.get(Env.EXAMPLE_TABLE_URI, "/tmp/airflow-eo-demo/orders")
TOPIC = os.environ.get(Env.EXAMPLE_TOPIC, "orders")

with DAG(
    dag_id="kafka_to_delta_reprocess",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    params={"reprocess_run_id": Param("", type="string", description="run id of kafka_to_delta_scheduled")},
    tags=["airflow-eo", "example"],
) as dag:
    KafkaToDeltaOperator(
        task_id="ingest",  # the task whose run is reprocessed has this id
        topics=[TOPIC], table_uri=TABLE_URI, ingest_id="orders",
        transform_sql="SELECT topic, partition, offset, timestamp, CAST(key AS STRING) AS key, "
                      "CAST(value AS STRING) AS body FROM source",
        reprocess=True, reprocess_dag_id="kafka_to_delta_scheduled",
        reprocess_run_id="{{ params.reprocess_run_id }}",
        spark_conf={"spark.ui.enabled": "false"},
    )
