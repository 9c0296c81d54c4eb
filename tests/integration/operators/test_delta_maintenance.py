"""DeltaMaintenanceOperator through ``dag.test()``: a table ingested by the ingest DAG is
compacted and checkpointed; the offsets stay, ingestion continues; errors fail fast."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tests.integration.airflow.dagtest import run_dag, xcom
from tests.conftest import SPARK_CONF
from tests.helpers import assert_exactly_once, committed_offsets, new_topic, produce


def ingest_dag(topic, table, kafka_conn_id):
    from airflow.sdk import DAG

    from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

    with DAG("eo_ingest_for_maintenance", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
        KafkaToDeltaOperator(task_id="ingest", topics=[topic], table_uri=table, ingest_id="orders",
                             kafka_conn_id=kafka_conn_id, spark_conf=SPARK_CONF, max_records_per_run=10)
    return dag


def test_the_maintenance_dag_compacts_beside_the_ingest_dag(airflow_db, hooks, kafka_env, broker, kafka_config,
                                                            tmp_path):
    """The ingest runs its Spark job in-process (``hooks``: SparkSubmitHook's stand-in)."""
    from airflow.sdk import DAG

    from airflow_eo.operators.delta_maintenance import DeltaMaintenanceOperator

    topic, table = new_topic(kafka_config, 2), str(tmp_path / "orders")
    produce(kafka_config, topic, 50, partitions=2)
    ingest = ingest_dag(topic, table, kafka_env)
    for day in range(1, 6):
        dr, states = run_dag(ingest, logical_date=datetime(2026, 3, day, tzinfo=timezone.utc))
        assert states["ingest"][0] == "success"
    offsets = committed_offsets(table, "orders", topic, 2)

    with DAG("eo_maintenance", schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False) as dag:
        DeltaMaintenanceOperator(task_id="maintain", table_uri="{{ params.table }}", retain_hours=0,
                                 params={"table": table})
    dr, states = run_dag(dag, logical_date=datetime(2026, 3, 6, tzinfo=timezone.utc))
    assert states["maintain"][0] == "success"
    done = xcom("eo_maintenance", dr.run_id, "maintain")["table"]
    assert done["compaction"]["numFilesRemoved"] >= 5 and done["layout"]["files"] == 1
    assert done["vacuum"]["files_deleted"] == done["compaction"]["numFilesRemoved"]
    assert committed_offsets(table, "orders", topic, 2) == offsets
    produce(kafka_config, topic, 4, partitions=2, start=50)
    dr, states = run_dag(ingest, logical_date=datetime(2026, 3, 7, tzinfo=timezone.utc))
    assert states["ingest"][0] == "success"
    assert assert_exactly_once(table, broker.bootstrap_servers, [topic], ingest_id="orders") == 54


def test_maintenance_of_a_missing_table_fails_without_retry(airflow_db, tmp_path):
    from airflow.providers.common.compat.sdk import AirflowFailException

    from airflow_eo.operators.delta_maintenance import DeltaMaintenanceOperator

    op = DeltaMaintenanceOperator(task_id="maintain", table_uri=str(tmp_path / "nothing"))
    with pytest.raises(AirflowFailException, match="no Delta table"):
        op.execute({})
