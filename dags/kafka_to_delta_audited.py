"""Example: a daily ingest followed by an audit of the table against Kafka (airflow-eo).

The audit reads only the batches committed since its last run (recorded beside the table),
so it stays cheap every day. It fails the run without retry when it finds drift — lost,
duplicated or stray records, gaps or overlaps between batches — and names the offsets in
its log (docs/audit.md says what each finding means and what to do). Connections as in
``kafka_to_delta_scheduled``; table and topic from ``AIRFLOW_EO_TABLE_URI`` / ``AIRFLOW_EO_TOPIC``.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

# common-compat's names: the example runs unchanged on Airflow 2.11 and 3.x (on 3.x alone: airflow.sdk)
from airflow.providers.common.compat.sdk import DAG

from airflow_eo.attempt import Env
from airflow_eo.operators.delta_kafka_audit import DeltaKafkaAuditOperator
from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

TABLE_URI = os.environ.get(Env.EXAMPLE_TABLE_URI, "/tmp/airflow-eo-demo/orders") + "_daily"
TOPIC = os.environ.get(Env.EXAMPLE_TOPIC, "orders")

# retries: the audit never retries drift (it fails at once); a broker outage is retried
with DAG(dag_id="kafka_to_delta_audited", schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False,
         max_active_runs=1, default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
         tags=["airflow-eo", "example"]) as dag:
    ingest = KafkaToDeltaOperator(
        task_id="ingest", topics=[TOPIC], table_uri=TABLE_URI, ingest_id="orders_daily",
        transform_sql="SELECT topic, partition, offset, timestamp, CAST(value AS STRING) AS body FROM source",
        spark_conf={"spark.ui.enabled": "false"},
    )
    audit = DeltaKafkaAuditOperator(task_id="audit", table_uri=TABLE_URI, ingest_id="orders_daily")
    ingest >> audit
