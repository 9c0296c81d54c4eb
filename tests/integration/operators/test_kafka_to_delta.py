"""KafkaToDeltaOperator without a metadata DB: real broker, real Delta, real planning.

The one boundary replaced is SparkSubmitHook: a stand-in that runs the very job
(``run_attempt``) in the session's SparkSession instead of spawning spark-submit, and
records what the operator handed to the hook (env vars vs. command-line arguments).
"""

from __future__ import annotations

import json
import os

from deltalake import DeltaTable

from airflow_eo.attempt import Env
from airflow_eo.operators.kafka_to_delta import run_key_of, summary_link
from airflow_eo.core.planning import BatchPlan
from airflow_eo.core.offsets import RunIdentity
from tests.helpers import duplicates, new_topic, produce, read_table
from tests.integration.operators.conftest import SECRET, context_for, make_operator


def test_operator_ingests_and_reports_summary_asset_and_link(hooks, kafka_env, kafka_config, table_uri):
    topic = new_topic(kafka_config)
    produce(kafka_config, topic, 15)
    op = make_operator("unit_dag", table_uri, topic, kafka_env)
    # concurrency is per table (the operator waits for a running attempt), not per DAG
    assert op.max_active_tis_per_dag is None and op.outlets == [op.asset_alias]
    ctx = context_for(op, "manual__1")
    summary = op.execute(ctx)

    assert summary["status"] == "committed" and summary["batch"] == 1 and summary["rows"] == 15
    assert summary["run_key"] == run_key_of("unit_dag", "manual__1", "ingest", -1) == "unit_dag/manual__1/ingest/-1"
    assert summary["version"] == DeltaTable(table_uri).version()
    meta = json.loads(DeltaTable(table_uri).history(1)[0]["airflow_eo.batch"])
    assert meta["run"]["run_id"] == "manual__1" and meta["rows"] == 15
    # the table's Asset event, emitted through the alias because this run committed
    assert ctx["outlet_events"][op.asset_alias].emitted == [(op.asset, summary)]
    assert op.asset.uri == f"file://{table_uri}"
    assert summary["files"] >= 1 and summary["bytes"] > 0 and summary["seconds"] > 0
    assert f"version={summary['version']}" in summary_link(summary) and "batch=1" in summary_link(summary)
    table = read_table(table_uri)
    assert table.num_rows == 15 and duplicates(table) == {}
    # the hook got the Kafka config as an env var only, never on the command line
    (hook,) = hooks
    assert json.loads(hook.kwargs["env_vars"][Env.KAFKA_CONFIG])["bootstrap.servers"] == kafka_config["bootstrap.servers"]
    assert all(SECRET not in str(a) for a in hook.kwargs["application_args"])
    assert SECRET not in json.dumps(hook.kwargs["conf"])
    # and nowhere in XCom, commit metadata or the files beside the table
    assert SECRET not in json.dumps(summary)
    for root, _, files in os.walk(table_uri):
        for name in files:
            if name.endswith((".json", ".crc")) or root.endswith("_delta_log"):
                assert SECRET not in open(os.path.join(root, name), errors="ignore").read(), name

    # on_kill reaches the hook of the running job (spark-submit / YARN app / driver pod)
    op.on_kill()
    assert hooks[0].killed

    # a retry / clear of the same run: reports the batch, starts no Spark job
    retry_ctx = context_for(op, "manual__1", try_number=2)
    again = op.execute(retry_ctx)
    assert again["status"] == "already_committed" and again["batch"] == 1 and not again["spark_started"]
    assert len(hooks) == 1
    # every kind of result carries the lag; a run that wrote nothing emits no Asset event
    assert again["lag"] == summary["lag"] and set(summary["lag"].values()) == {0}
    assert retry_ctx["outlet_events"][op.asset_alias].emitted == []
    nothing = op.execute(ctx2 := context_for(op, "manual__2"))
    assert nothing["status"] == "nothing_new" and nothing["lag"] == summary["lag"]
    assert ctx2["outlet_events"][op.asset_alias].emitted == []


def test_reprocess_flag_from_params_or_argument(kafka_env, table_uri):
    op = make_operator("unit_dag2", table_uri, "t", kafka_env)
    run = op.run_identity(context_for(op, "scheduled__x"))
    assert op.reprocess_target(context_for(op, "scheduled__x"), run) is None
    assert op.reprocess_target(context_for(op, "r", params={"reprocess": True}), run) == "unit_dag2/scheduled__x/ingest/-1"
    assert op.reprocess_target(context_for(op, "r", params={"reprocess": "true", "reprocess_run_id": "old"}), run) \
        == "unit_dag2/old/ingest/-1"
    op2 = make_operator("unit_dag3", table_uri, "t", kafka_env, reprocess=True, reprocess_dag_id="other",
                        reprocess_run_id="r7")
    assert op2.reprocess_target(context_for(op2, "x", params={"reprocess": False}), run) == "other/r7/ingest/-1"


def test_templated_table_uri_gets_its_asset_at_run_time(kafka_env):
    op = make_operator("unit_dag4", "{{ params.table }}", "t", kafka_env)
    assert op.asset is None and "table_uri" in op.template_fields
    assert op.outlets == [op.asset_alias] and op.asset_alias.name == "airflow-eo:unit_dag4.ingest"


def test_storage_connection_and_decoding_options_reach_the_ingest_config(kafka_env, monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_CONN_S3_UNIT", json.dumps({
        "conn_type": "aws", "login": "AKIDUNIT", "password": SECRET,
        "extra": {"endpoint_url": "http://127.0.0.1:9", "region_name": "eu-west-1", "conditional_put": "etag"}}))
    op = make_operator("unit_dag5", "s3://bucket/orders", "t", kafka_env, storage_conn_id="s3_unit",
                       storage_options={"AWS_S3_ADDRESSING_STYLE": "path"}, value_schema="id INT, name STRING",
                       dead_letter_table_uri="s3://bucket/orders_dead", max_dead_letters=5,
                       schema_evolution=True, mirror_consumer_group="orders-lag", partition_by=["date"])
    config = op.ingest_config()
    assert config.storage_options == {
        "AWS_ACCESS_KEY_ID": "AKIDUNIT", "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ALLOW_HTTP": "true", "conditional_put": "etag",
        "AWS_S3_ADDRESSING_STYLE": "path"}
    assert SECRET not in repr(config)  # storage options and Kafka config are kept out of reprs
    attempt = config.attempt(BatchPlan(config.ingest_id, 1, (), RunIdentity("r"), attempt_id="a1"))
    assert attempt.dead_letters.table_uri == "s3://bucket/orders_dead" and attempt.dead_letters.max_count == 5
    assert SECRET not in attempt.to_json()  # what is written beside the table holds no secret
    assert config.spec.decode.value_schema == "id INT, name STRING" and config.spec.dead_letters.max_count == 5
    assert config.spec.table.schema_evolution and config.spec.source.mirror_consumer_group == "orders-lag"
    assert "dead_letter_table_uri" in op.template_fields and "partition_by" in op.template_fields
    assert config.spec.table.partition_by == ("date",) and attempt.partition_by == ("date",)


def test_a_spark_connect_connection_runs_the_batch_on_the_warm_server(kafka_env, kafka_config, connect_server,
                                                                      table_uri, monkeypatch):
    """spark_conn_id of the Spark provider's `spark_connect` type: no spark-submit, the batch runs
    on that server; the URL (and a token) come from SparkConnectHook and the token is masked."""
    from airflow_eo.submit.connect import ConnectSubmitter

    masked = []
    monkeypatch.setattr("airflow.sdk.log.mask_secret", lambda value, name=None: masked.append(value))
    host, port = connect_server.url.removeprefix("sc://").split(":")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_WARM", json.dumps({"conn_type": "spark_connect", "host": host, "port": int(port)}))
    topic = new_topic(kafka_config)
    produce(kafka_config, topic, 25)
    op = make_operator("unit_dag_warm", table_uri, topic, kafka_env, spark_conn_id="spark_warm")
    summary = op.execute(context_for(op, "manual__warm"))
    assert isinstance(op.submitter, ConnectSubmitter) and op.submitter.submissions == 1
    assert summary["status"] == "committed" and summary["rows"] == 25 and summary["spark_started"]
    assert read_table(table_uri).num_rows == 25 and duplicates(read_table(table_uri)) == {}

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TOKEN", json.dumps(
        {"conn_type": "spark_connect", "host": host, "port": int(port), "password": "t0k3n-secret"}))
    with_token = make_operator("unit_dag_warm2", table_uri, topic, kafka_env, spark_conn_id="spark_token")
    assert "token=t0k3n-secret" in with_token.make_submitter().url and "t0k3n-secret" in masked


def test_operator_with_sinks_reads_once_into_each_table_and_reports_each(hooks, kafka_env, kafka_config, tmp_path):
    """``sinks``: one Spark job (the hook is called once) commits a raw table and a merge table; the
    XCom lists both, each gets its Asset event and is a lineage output; a retry starts no job."""
    from datetime import datetime

    from airflow.providers.common.compat.sdk import DAG

    from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator, table_asset

    topic = new_topic(kafka_config)
    produce(kafka_config, topic, 15)
    raw, latest = str(tmp_path / "raw"), str(tmp_path / "latest")
    with DAG("unit_fan", schedule=None, start_date=datetime(2026, 1, 1)):
        op = KafkaToDeltaOperator(task_id="ingest", topics=[topic], kafka_conn_id=kafka_env, sinks=[
            {"table_uri": raw, "transform_sql": "SELECT topic, partition, offset, CAST(value AS STRING) AS body "
                                                "FROM source"},
            {"table_uri": latest, "write_mode": "merge", "merge_key": "p",
             "transform_sql": "SELECT partition AS p, topic, partition, offset FROM source"}])
    ctx = context_for(op, "manual__1")
    summary = op.execute(ctx)
    assert len(hooks) == 1  # one read for both tables
    assert summary["status"] == "committed" and summary["table_uris"] == [latest, raw]
    assert [(t["status"], t["rows"]) for t in summary["tables"]] == [("committed", 3), ("committed", 15)]
    assert read_table(raw).num_rows == 15 and duplicates(read_table(raw)) == {}
    assert read_table(latest).num_rows == 3  # one row per partition
    assert [a for a, _ in ctx["outlet_events"][op.asset_alias].emitted] == [table_asset(latest), table_asset(raw)]
    lineage = op.get_openlineage_facets_on_complete(None)
    assert [i.name for i in lineage.inputs] == [topic] and [o.name for o in lineage.outputs] == [latest, raw]
    assert [f.name for f in lineage.outputs[0].facets["schema"].fields] == ["p", "topic", "partition", "offset"]
    assert SECRET not in json.dumps(summary)

    again = op.execute(retry := context_for(op, "manual__1", try_number=2))
    assert [t["status"] for t in again["tables"]] == ["already_committed"] * 2 and len(hooks) == 1
    assert retry["outlet_events"][op.asset_alias].emitted == []
