"""Reader schemas resolved when a batch is planned, pinned in its logged plan and its commit, and used
by every replay: a retry after a new version was registered, a reprocess, a plan an earlier version
logged. The registry is the labelled test double (airflow_eo/testing/registry.py, a local HTTP server);
Kafka is in memory and the driver stages Parquet without Spark, building the read step's decoder as
the real driver does (that is where the reader schemas are chosen)."""

from __future__ import annotations

import json
import logging
import os

import pyarrow.parquet as pq
import pytest

from airflow_eo.decoding.decoder import record_decoder
from airflow_eo.decoding.reader_schemas import pin, reader_schemas
from airflow_eo.decoding.registry import SchemaRegistry
from airflow_eo.driver.batch import commit_staged
from airflow_eo.core.errors import ConfigError, SparkJobError
from airflow_eo.loop.ingest import Ingestion
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.core.planning import BatchPlan, ReaderSchema
from airflow_eo.core.offsets import RunIdentity, TopicPartition
from airflow_eo.loop.reprocess import Reprocessor
from airflow_eo.spec.columns import RawColumn, RegistryAvro, Source
from airflow_eo.table.commit import StagedBatch
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.metadata import BatchFindings, BatchMetadata
from airflow_eo.table.staging import StagingArea
from airflow_eo.table.storage import TableLocation
from airflow_eo.testing.registry import RegistryDouble
from tests.unit.decoding.fake_registry import V1, V2
from tests.unit.fakes import FakeKafka
from tests.unit.loop.test_results import BASE_MS, SCHEMA, records

T0 = TopicPartition("orders", 0)
V3 = {**V2, "fields": [*V2["fields"], {"name": "tier", "type": "string", "default": "gold"}]}


@pytest.fixture
def registry():
    double = RegistryDouble().start()
    double.register("orders-value", json.dumps(V1))
    yield double
    double.stop()


class Driver:
    """Builds the read step's decoder as the driver does, then stages the plan's offsets and commits
    them with the reader schemas it decoded with (the driver's step 5); ``kills`` attempts die first."""

    def __init__(self, kills: int = 0):
        self.kills, self.used = kills, []

    def submit(self, attempt, secrets) -> None:
        staging = StagingArea(TableLocation.of(attempt.table_uri))
        staging.driver_started(attempt.attempt_id)
        decoder, used = record_decoder(attempt.decode.columns, secrets.schema_registry, attempt.plan)
        self.used.append(used)
        if self.kills:
            self.kills -= 1
            raise RuntimeError("killed before it read anything")
        plan, target = attempt.plan, staging.attempt_path(attempt.plan)
        os.makedirs(target)
        pq.write_table(records(o for r in plan.data_ranges for o in range(r.start, r.end)),
                       os.path.join(target, "part-00000.parquet"))
        files = staging.staged_files(target)
        commit_staged(attempt, staging, StagedBatch(plan, tuple(files), staging.rows_per_partition(files), SCHEMA),
                      BatchFindings.of(attempt, reader_schemas=used), None)


@pytest.fixture
def make(ingestion, tmp_path, registry):
    kafka = FakeKafka(orders=1)

    def build(driver, **options):
        base = ingestion(str(tmp_path / "orders"), "orders", dict(kafka.config), driver, ingest_id="orders_avro",
                         value_format="avro", dead_letter_table_uri=str(tmp_path / "dlq"),
                         schema_registry={"url": registry.url}, **options)
        return Ingestion(base.config, driver, kafka=kafka)

    build.kafka = kafka
    return build


def produce(kafka, n: int) -> None:
    kafka.produce(T0, *(BASE_MS + i for i in range(n)))


def pinned(version: int, schema_id: int, requested: str = "latest") -> ReaderSchema:
    return ReaderSchema("value", "orders-value", version, schema_id, requested)


def recorded(table_uri: str, batch: int) -> tuple[ReaderSchema, ...]:
    return Ledger.open(table_uri).find_batch("orders_avro", batch=batch).meta.findings.reader_schemas


def test_a_retry_after_a_new_version_was_registered_decodes_with_the_planned_one(make, registry, caplog):
    driver = Driver(kills=1)
    ing = make(driver)
    produce(make.kafka, 10)
    with pytest.raises(SparkJobError):
        ing.run(RunIdentity("run-1"))
    assert ing.plans.load("run-1").reader_schemas == (pinned(1, 1),)  # logged before Spark started
    v2 = registry.register("orders-value", json.dumps(V2))  # a producer moves on between the kill and the retry
    caplog.set_level(logging.INFO, logger="airflow_eo")
    retry = ing.run(RunIdentity("run-1"))
    assert retry.status is RunStatus.COMMITTED and retry.rows == 10
    assert driver.used == [(pinned(1, 1),), (pinned(1, 1),)]
    assert recorded(ing.config.table_uri, 1) == (pinned(1, 1),)
    assert "batch 1: the value reader schema is orders-value version 1 (schema id 1), pinned in its plan" in caplog.text

    produce(make.kafka, 5)  # the next batch is planned with the version that is latest now
    assert ing.run(RunIdentity("run-2")).status is RunStatus.COMMITTED
    assert driver.used[-1] == (pinned(2, v2),) == recorded(ing.config.table_uri, 2)

    registry.register("orders-value", json.dumps(V3))
    redo = Reprocessor(ing).run(RunIdentity("fix-1"), "run-1")  # months later: the batch's own version
    assert redo.status is RunStatus.REPROCESSED and driver.used[-1] == (pinned(1, 1),)
    assert recorded(ing.config.table_uri, 1) == (pinned(1, 1),)


def test_one_registry_call_per_planned_batch_and_none_when_there_is_nothing_new(make, registry):
    ing = make(Driver(), value_schema_version="1")
    assert ing.run(RunIdentity("run-0")).rows == 0  # an empty topic: its partition's start is committed
    assert ing.plans.load("run-0").reader_schemas == (pinned(1, 1, requested="1"),)  # (its columns are typed)
    asked = registry.requests["subject_version"]
    assert ing.run(RunIdentity("run-0b")).status is RunStatus.NOTHING_NEW
    assert registry.requests["subject_version"] == asked
    produce(make.kafka, 3)
    registry.register("orders-value", json.dumps(V2))
    ing.run(RunIdentity("run-1"))
    assert registry.requests["subject_version"] == asked + 1  # the attempt fetched the pinned schema by id
    assert ing.plans.load("run-1").reader_schemas == (pinned(1, 1, requested="1"),)


def test_a_plan_an_earlier_version_logged_still_replays_and_says_how_it_resolved(make, registry, caplog):
    driver = Driver(kills=1)
    ing = make(driver)
    produce(make.kafka, 4)
    with pytest.raises(SparkJobError):
        ing.run(RunIdentity("run-1"))
    path = ing.plans.path("run-1")  # the plan as the previous version wrote it: no reader schemas
    old = json.loads(ing.location.read_text(path))
    del old["reader_schemas"]
    ing.location.write_text(path, json.dumps(old))
    assert ing.plans.load("run-1").reader_schemas is None
    v2 = registry.register("orders-value", json.dumps(V2))
    caplog.set_level(logging.INFO, logger="airflow_eo")
    assert ing.run(RunIdentity("run-1")).status is RunStatus.COMMITTED
    assert driver.used[-1] == (pinned(2, v2),) == recorded(ing.config.table_uri, 1)  # resolved when it started
    assert "its plan was logged without reader schema versions (by an earlier version of airflow-eo); the value " \
           "reader schema (orders-value latest) is resolved now: orders-value version 2" in caplog.text

    registry.register("orders-value", json.dumps(V3))  # a reprocess of that batch reads what its commit recorded
    assert Reprocessor(ing).run(RunIdentity("fix-1"), "run-1").status is RunStatus.REPROCESSED
    assert driver.used[-1] == (pinned(2, v2),)


def test_commit_metadata_without_reader_schemas_reads_and_with_them_round_trips():
    old = BatchMetadata.from_json('{"ingest_id": "o", "batch": 1, "rows": 3}')
    assert old.findings.reader_schemas == () and "reader_schemas" not in old.to_dict()
    meta = BatchMetadata.of(old.operation, BatchPlan("o", 2, (), RunIdentity("r")),
                            findings=BatchFindings(reader_schemas=(pinned(4, 9),)))
    assert meta.to_dict()["reader_schemas"] == [{"column": "value", "subject": "orders-value", "version": 4,
                                                 "schema_id": 9, "requested": "latest"}]
    assert BatchMetadata.from_json(meta.to_json()) == meta
    plan = BatchPlan("o", 2, (), RunIdentity("r"), reader_schemas=(pinned(4, 9),))
    assert BatchPlan.from_json(plan.to_json()) == plan
    assert BatchPlan.from_json(json.dumps({k: v for k, v in json.loads(plan.to_json()).items()
                                           if k != "reader_schemas"})).reader_schemas is None


def test_a_changed_spec_is_not_replayed_and_a_vanished_pinned_schema_is_a_config_error(registry, caplog):
    client = SchemaRegistry({"url": registry.url})
    registry.register("orders-value", json.dumps(V2))
    latest = (RegistryAvro(source=Source.VALUE, subject="orders-value"), RawColumn(source=Source.KEY))
    plan = BatchPlan("o", 1, (), RunIdentity("r"), reader_schemas=pin(latest, {"url": registry.url}))
    assert plan.reader_schemas == (pinned(2, 2),)
    first = (RegistryAvro(source=Source.VALUE, subject="orders-value", version=1), RawColumn(source=Source.KEY))
    caplog.set_level(logging.INFO, logger="airflow_eo")
    (found, schema), = reader_schemas(first, client, plan).values()
    assert found == pinned(1, 1, requested="1") and json.loads(schema.text) == V1 and schema.schema_type == "AVRO"
    assert "the spec asks for another subject or version than its plan pinned" in caplog.text
    gone = BatchPlan("o", 1, (), RunIdentity("r"), reader_schemas=(pinned(2, 99),))
    with pytest.raises(ConfigError, match="orders-value version 2 \\(schema id 99\\), is no longer in the Schema "
                                          "Registry at http://127.0.0.1:\\d+: register it again"):
        reader_schemas(latest, client, gone)
    with pytest.raises(ConfigError, match="needs a Schema Registry"):
        pin(latest, None)
    assert pin((RawColumn(source=Source.VALUE), RawColumn(source=Source.KEY)), None) == ()
