"""dag.test() of DeltaKafkaAuditOperator after an ingest: clean → success with the report as XCom;
a duplicated row → failed without retry, the offset in the log; metrics and the OpenLineage
data-quality facet emitted either way (real broker, spark-submit, Delta)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import pyarrow.compute as pc
import pyarrow.dataset as pads
from deltalake import DeltaTable, write_deltalake
from openlineage.client.serde import Serde

from tests.conftest import SPARK_CONF
from tests.integration.airflow.dagtest import run_dag, xcom
from tests.helpers import new_topic, produce

SQL = "SELECT topic, partition, offset, CAST(value AS STRING) AS body FROM source"


class Recorder:  # Airflow's Stats, at its boundary
    calls: list = []

    @classmethod
    def gauge(cls, name, value, tags=None):
        cls.calls.append((name, value, tags))

    incr = timing = gauge


def audited_dag(table: str, topic: str, facets: list):
    from airflow.sdk import DAG

    from airflow_eo.operators.delta_kafka_audit import DeltaKafkaAuditOperator
    from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

    def keep_facets(context):  # the executed operator's lineage, as the OpenLineage listener asks it
        lineage = context["task"].get_openlineage_facets_on_complete(None)
        facets.append([json.loads(Serde.to_json(d)) for d in lineage.inputs])

    with DAG("eo_audited", schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False,
             default_args={"retries": 2, "retry_delay": timedelta(seconds=1)}) as dag:
        ingest = KafkaToDeltaOperator(task_id="ingest", topics=[topic], table_uri=table, ingest_id="orders",
                                      transform_sql=SQL, spark_conf=SPARK_CONF)
        audit = DeltaKafkaAuditOperator(task_id="audit", table_uri="{{ params.table }}", ingest_id="orders",
                                        audit_all=True, params={"table": table},
                                        on_success_callback=keep_facets, on_failure_callback=keep_facets)
        ingest >> audit
    return dag


def test_clean_audit_succeeds_and_drift_fails_without_retry(airflow_db, airflow_connections, kafka_config,
                                                            tmp_path, monkeypatch, capfd):
    monkeypatch.setattr("airflow_eo.operators.metrics._stats", Recorder)
    topic, table, facets = new_topic(kafka_config, 2), str(tmp_path / "orders"), []
    produce(kafka_config, topic, 20, partitions=2)
    dag = audited_dag(table, topic, facets)
    day = datetime(2026, 3, 1, tzinfo=timezone.utc)
    dr, states = run_dag(dag, logical_date=day, run_after=day)
    assert states == {"ingest": ("success", 1), "audit": ("success", 1)}
    report = xcom(dag.dag_id, dr.run_id, "audit")
    assert report["drift"] is False and report["batches"] == [1] and report["checked_offsets"] == 20
    assert ("airflow_eo.audit.lost", 0, {"table": table, "ingest_id": "orders"}) in Recorder.calls
    (dataset,) = facets[-1]
    assertions = {a["assertion"]: a["success"] for a in dataset["inputFacets"]["dataQualityAssertions"]["assertions"]}
    assert assertions == {"no_lost_records": True, "no_duplicates": True, "no_stray_records": True,
                          "contiguous_ranges": True, "txn_matches_last_range": True}

    files = DeltaTable(table).file_uris()  # the same row appended again, behind the ingest's back
    data = pads.dataset(files, format="parquet").to_table()
    write_deltalake(table, data.filter(pc.equal(data["offset"], 3)).slice(0, 1), mode="append")
    Recorder.calls.clear()
    day2 = day + timedelta(days=1)
    dr2, states = run_dag(dag, logical_date=day2, run_after=day2)
    assert states["audit"] == ("failed", 1)  # AirflowFailException: no retry spent
    assert xcom(dag.dag_id, dr2.run_id, "audit") is None
    logged = capfd.readouterr()  # the task's log (Airflow's structured logging writes to the process output)
    assert re.search(r"audit drift: t-\w+\[[01]\] duplicated 1 at 3", logged.out + logged.err)
    assert ("airflow_eo.audit.duplicated", 1, {"table": table, "ingest_id": "orders"}) in Recorder.calls
    (dataset,) = facets[-1]
    assertions = {a["assertion"]: a["success"] for a in dataset["inputFacets"]["dataQualityAssertions"]["assertions"]}
    assert assertions["no_duplicates"] is False and assertions["no_lost_records"] is True
