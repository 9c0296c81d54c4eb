"""An Avro topic through a Schema Registry *connection*, run by ``dag.test()`` with spark-submit.

The registry is ``airflow_eo.testing.registry`` (a labelled test double of the Confluent REST API)
with basic auth: the credentials go from the Airflow connection to the Spark job through the
environment, and appear in no XCom, attempt record or commit metadata.
"""

from __future__ import annotations

import glob
import json
import os
from datetime import datetime, timezone

from deltalake import DeltaTable

from tests.integration.airflow.dagtest import run_dag, xcom
from tests.conftest import SPARK_CONF
from tests.helpers import new_topic, produce_avro, read_table
from airflow_eo.testing.registry import RegistryDouble

PASSWORD = "s3cret-registry-password"
SCHEMA = json.dumps({"type": "record", "name": "Event", "fields": [
    {"name": "id", "type": "long"}, {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}}]})


def test_avro_dag_with_a_registry_connection(airflow_db, airflow_connections, kafka_config, tmp_path, monkeypatch):
    from airflow.sdk import DAG

    from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

    registry = RegistryDouble(user_info=f"reader:{PASSWORD}").start()
    try:
        port = int(registry.url.rsplit(":", 1)[1])
        monkeypatch.setenv("AIRFLOW_CONN_SCHEMA_REGISTRY_TEST", json.dumps({
            "conn_type": "http", "host": "127.0.0.1", "port": port, "login": "reader", "password": PASSWORD}))
        topic = new_topic(kafka_config, 2)
        produce_avro(kafka_config, topic, [{"id": i, "kind": "AB"[i % 2]} for i in range(40)], SCHEMA,
                     {"url": registry.url, "basic.auth.user.info": f"reader:{PASSWORD}"}, 2)
        table, dead = str(tmp_path / "events"), str(tmp_path / "events_dlq")
        with DAG("eo_avro", schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False) as dag:
            KafkaToDeltaOperator(
                task_id="ingest", topics=[topic], table_uri=table, ingest_id="events", spark_conf=SPARK_CONF,
                value_format="avro", schema_registry_conn_id="schema_registry_test", dead_letter_table_uri=dead,
                transform_sql="SELECT topic, partition, offset, data.id AS id, data.kind AS kind FROM source")
        dr, states = run_dag(dag, logical_date=datetime(2026, 3, 1, tzinfo=timezone.utc))
        assert states["ingest"][0] == "success"
        summary = xcom("eo_avro", dr.run_id, "ingest")
        assert summary["status"] == "committed" and summary["rows"] == 40 and summary["dead_letters"] == 0
        rows = sorted(read_table(table, ["id", "kind"]).to_pylist(), key=lambda r: r["id"])
        assert rows == [{"id": i, "kind": "AB"[i % 2]} for i in range(40)]
        # the credentials reached the job (the registry answered) and were written down nowhere
        assert registry.requests["subject_version"] >= 1 and registry.requests["schema_by_id"] >= 1
        assert PASSWORD not in json.dumps(summary)
        written = glob.glob(os.path.join(table, "_airflow_eo", "**", "*.json"), recursive=True)
        written += glob.glob(os.path.join(table, "_delta_log", "*.json"))
        assert written and not [p for p in written if PASSWORD in open(p).read()]
        assert PASSWORD not in json.dumps(DeltaTable(table).history())
    finally:
        registry.stop()
