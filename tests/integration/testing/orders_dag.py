"""A user's DAG, as the plugin's guide tests it (docs/how-to/testing.md): orders from Kafka into a Delta table.

It is written the way a DAG file of a user is, with one difference a test needs: the topic, the
table and the connections come from a factory's arguments (a DAG file would read them from
Variables or its own constants).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

# the user's transform: the order id from the Kafka key, the amount from the JSON value
ORDERS_SQL = ("SELECT topic, partition, offset, CAST(key AS STRING) AS order_id, "
              "CAST(get_json_object(CAST(value AS STRING), '$.amount') AS DOUBLE) AS amount FROM source")
SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}  # small Spark for tests


def orders_dag(topic: str, table_uri: str, storage_conn_id: str | None = None, write_mode: str = "append",
               dag_id: str = "orders_to_delta"):
    """Every hour, the new orders into the table: appended (every record a row), or merged by
    ``order_id`` (one row per order, the last change wins; a tombstone deletes it)."""
    with DAG(dag_id, schedule="@hourly", start_date=datetime(2026, 1, 1), catchup=False,
             default_args={"retries": 2, "retry_delay": timedelta(minutes=5)}) as dag:
        KafkaToDeltaOperator(
            task_id="ingest", topics=[topic], table_uri=table_uri, ingest_id="orders",
            transform_sql=ORDERS_SQL, storage_conn_id=storage_conn_id, spark_conf=SPARK_CONF,
            **({"write_mode": "merge", "merge_key": "order_id"} if write_mode == "merge" else {}),
        )
    return dag
