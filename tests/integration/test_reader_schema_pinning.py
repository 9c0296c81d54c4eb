"""The reader schema is part of the logged plan: a killed attempt's retry, and a reprocess of the batch
later, decode with the version resolved when the batch was planned, not the one registered since.

``airflow-eo ingest`` runs as a user would (its own session, real spark-submit or a real Spark
Connect server, the session's broker) and is killed with its process group once its driver started
(``before_read@group``). Then a producer registers a new reader schema version (a new field with a
default: decoded with it, every row would carry ``tier = 'gold'``); the retry of the same run key
commits the batch decoded with the first version, the next run decodes with the new one, and
``airflow-eo reprocess`` of the first batch keeps the first. The registry is the labelled test double
(``airflow_eo/testing/registry.py``); records are produced with confluent-kafka's ``AvroSerializer``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from airflow_eo.core.planning import ReaderSchema
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.plan_log import PlanLog
from airflow_eo.table.storage import TableLocation
from tests.helpers import new_topic, produce_avro, read_table
from airflow_eo.testing.kafka import TestBroker
from airflow_eo.testing.registry import RegistryDouble

CLI = os.path.join(os.path.dirname(sys.executable), "airflow-eo")
INGEST_ID = "pinned"
V1 = {"type": "record", "name": "Reading", "namespace": "plant", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "tier", "type": "string", "default": "gold"}]}


@pytest.fixture(scope="module")
def registry():
    double = RegistryDouble().start()
    yield double
    double.stop()


@pytest.fixture(params=["spark-submit", "connect"])
def remote(request):
    return request.getfixturevalue("connect_server").url if request.param == "connect" else None


def cli(command, kafka_config, table, topic, registry, scratch, remote, *args, failpoints="", fmt="avro"):
    """``airflow-eo ingest|reprocess`` of ``fmt`` values through the registry, in a session of its own."""
    cmd = [CLI, command, table, "--ingest-id", INGEST_ID, "--topics", topic, "--value-format", fmt,
           "--schema-registry", registry.url, "--dead-letter-table", table + "_dlq", "--schema-evolution",
           "--transform-sql", "SELECT topic, partition, offset, data.* FROM source",
           "--bootstrap-servers", kafka_config["bootstrap.servers"], "--json", *args]
    if command == "ingest":
        cmd.insert(2, "--table")
    cmd += ["--remote", remote] if remote else ["--master", "local[1]", "--conf", "spark.ui.enabled=false"]
    env = {**os.environ, "AIRFLOW_EO_SCRATCH_DIR": scratch, "AIRFLOW_EO_FAILPOINTS": failpoints}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, start_new_session=True)


def reader_schemas_of(table: str, batch: int) -> tuple[ReaderSchema, ...]:
    return Ledger.open(table).find_batch(INGEST_ID, batch=batch).meta.findings.reader_schemas


def test_a_retry_and_a_reprocess_decode_with_the_reader_schema_of_the_plan(kafka_config, registry, table_uri,
                                                                           tmp_path, remote):
    scratch = str(tmp_path / "scratch")
    os.mkdir(scratch)
    topic = new_topic(kafka_config, 2)
    subject = f"{topic}-value"
    produce_avro(kafka_config, topic, [{"id": i, "name": f"n{i}"} for i in range(20)], json.dumps(V1),
                 {"url": registry.url}, partitions=2)
    first = ReaderSchema("value", subject, 1, registry.subjects[subject][0])

    killed = cli("ingest", kafka_config, table_uri, topic, registry, scratch, remote, "--run-key", "run-1",
                 failpoints="before_read@group")
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-3000:]
    assert PlanLog(TableLocation.of(table_uri)).load("run-1").reader_schemas == (first,)

    newer = registry.register(subject, json.dumps(V2))  # between the kill and the retry
    retry = cli("ingest", kafka_config, table_uri, topic, registry, scratch, remote, "--run-key", "run-1")
    assert retry.returncode == 0, retry.stderr[-3000:]
    assert (json.loads(retry.stdout)["status"], json.loads(retry.stdout)["rows"]) == ("committed", 20)
    assert "tier" not in read_table(table_uri).schema.names  # decoded with version 1: no such field
    assert reader_schemas_of(table_uri, 1) == (first,)

    produce_avro(kafka_config, topic, [{"id": i, "name": f"n{i}"} for i in range(20, 25)], json.dumps(V1),
                 {"url": registry.url}, partitions=2)
    following = cli("ingest", kafka_config, table_uri, topic, registry, scratch, remote, "--run-key", "run-2")
    assert following.returncode == 0, following.stderr[-3000:]
    assert reader_schemas_of(table_uri, 2) == (ReaderSchema("value", subject, 2, newer),)

    redo = cli("reprocess", kafka_config, table_uri, topic, registry, scratch, remote, "--run-key", "run-1")
    assert redo.returncode == 0, redo.stderr[-3000:]
    assert json.loads(redo.stdout)["status"] == "reprocessed"
    assert reader_schemas_of(table_uri, 1) == (first,)  # the reprocess commit: the batch's own version
    rows = {r["id"]: r["tier"] for r in read_table(table_uri, ["id", "tier"]).to_pylist()}
    assert sorted(rows) == list(range(25))  # each record once
    assert {rows[i] for i in range(20)} == {None} and {rows[i] for i in range(20, 25)} == {"gold"}


PROTO_V1 = 'syntax = "proto3"; package plant; message Reading { int64 id = 1; string name = 2; }'
PROTO_V2 = PROTO_V1.replace("string name = 2;", "string name = 2; string tier = 3;")
JSON_V1 = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}, "required": ["id"]}
JSON_V2 = {**JSON_V1, "properties": {**JSON_V1["properties"], "tier": {"type": "string"}}}


@pytest.mark.parametrize("fmt, remote", [("protobuf", "spark-submit"), ("protobuf", "connect"),
                                         ("json_schema", "connect")], indirect=["remote"])
def test_a_retry_after_a_kill_mid_batch_decodes_protobuf_and_json_schema_with_the_planned_schema(
        fmt, kafka_config, registry, table_uri, tmp_path, remote):
    """Killed with its process group once the batch was read, decoded and staged (``after_stage@group``);
    a newer reader version registered before the retry, which still decodes with the plan's."""
    from google.protobuf import message_factory

    from airflow_eo.decoding.protobuf_schemas import compile_proto

    scratch = str(tmp_path / "scratch")
    os.mkdir(scratch)
    topic = new_topic(kafka_config, 2)
    subject = f"{topic}-value"
    broker = TestBroker.connect(kafka_config["bootstrap.servers"])
    if fmt == "protobuf":
        cls = message_factory.GetMessageClass(compile_proto(PROTO_V1).message("plant.Reading"))
        broker.produce_protobuf(topic, [cls(id=i, name=f"n{i}") for i in range(20)], registry.config)
    else:
        broker.produce_json_schema(topic, [{"id": i, "name": f"n{i}"} for i in range(20)], json.dumps(JSON_V1),
                                   registry.config)
    first = ReaderSchema("value", subject, 1, registry.subjects[subject][0])

    killed = cli("ingest", kafka_config, table_uri, topic, registry, scratch, remote, "--run-key", "run-1",
                 failpoints="after_stage@group", fmt=fmt)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-3000:]
    assert PlanLog(TableLocation.of(table_uri)).load("run-1").reader_schemas == (first,)

    newer = registry.register(subject, PROTO_V2 if fmt == "protobuf" else json.dumps(JSON_V2),
                              "PROTOBUF" if fmt == "protobuf" else "JSON")
    retry = cli("ingest", kafka_config, table_uri, topic, registry, scratch, remote, "--run-key", "run-1", fmt=fmt)
    assert retry.returncode == 0, retry.stderr[-3000:]
    assert (json.loads(retry.stdout)["status"], json.loads(retry.stdout)["rows"]) == ("committed", 20)
    assert "tier" not in read_table(table_uri).schema.names  # decoded with version 1: no such field
    assert reader_schemas_of(table_uri, 1) == (first,)
    if fmt == "protobuf":  # a producer on the newer version: the next batch pins it and the column arrives
        cls = message_factory.GetMessageClass(compile_proto(PROTO_V2).message("plant.Reading"))
        broker.produce_protobuf(topic, [cls(id=i, name=f"n{i}", tier="gold") for i in range(20, 25)], registry.config)
    else:
        broker.produce_json_schema(topic, [{"id": i, "name": f"n{i}", "tier": "gold"} for i in range(20, 25)],
                                   json.dumps(JSON_V2), registry.config)
    following = cli("ingest", kafka_config, table_uri, topic, registry, scratch, remote, "--run-key", "run-2", fmt=fmt)
    assert following.returncode == 0, following.stderr[-3000:]
    assert reader_schemas_of(table_uri, 2) == (ReaderSchema("value", subject, 2, newer),)
    rows = {r["id"]: r for r in read_table(table_uri, ["id", "name", "tier"]).to_pylist()}
    assert sorted(rows) == list(range(25)) and all(r["name"] == f"n{i}" for i, r in rows.items())  # each once
    assert {rows[i]["tier"] for i in range(20)} == {None} and {rows[i]["tier"] for i in range(20, 25)} == {"gold"}
