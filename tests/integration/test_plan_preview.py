"""The plan preview (``airflow-eo plan``, the operator's ``dry_run``): what the next run reads, writing nothing.

Each preview is followed by the run it previews: the ranges the preview names are the ranges the
run then commits, and its record count the rows it appends. Around every preview the whole tree
of the table (its Delta log, the plan log, attempt markers, staging) and of the dead-letter table
is hashed: byte for byte unchanged. Modes: offsets on a new table, a caught-up table and a run
key already committed, an interval (and one still open), a merge table, dedup, Avro through a
registry (reader schemas pinned, nothing registered), the command line and the operator.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest

from airflow_eo.cli import main
from airflow_eo.core.intervals import interval_of
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.loop.preview import NO_SPARK, PlanPreview, plan_preview
from airflow_eo.testing.registry import RegistryDouble
from tests.conftest import DriverSubmitter
from tests.helpers import ORDER_SCHEMA, new_topic, order, produce, produce_avro, transactional_producer


def tree(path: str) -> dict[str, str] | None:
    """Every file under ``path`` with the hash of its bytes (None: no such directory)."""
    if not os.path.exists(path):
        return None
    found = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                found[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
    return found


NEW_RUN = RunIdentity("")  # a run of its own: no logged plan to replay


def previewed(ingestion, run: RunIdentity = NEW_RUN, interval=None, *trees: str) -> PlanPreview:
    """The preview of ``ingestion``'s next run, asserting the tables' trees did not change."""
    from airflow_eo.loop.ingest import Ingestion

    paths = [ingestion.config.table_uri] + ([ingestion.config.spec.dead_letters.table_uri]
                                            if ingestion.config.spec.dead_letters.table_uri else []) + list(trees)
    before = {p: tree(p) for p in paths}
    preview = plan_preview(Ingestion(ingestion.config, NO_SPARK), run, interval)
    assert {p: tree(p) for p in paths} == before, "the preview wrote something"
    return preview


def spans(preview: PlanPreview) -> list[tuple]:
    return sorted((r.topic, r.partition, r.start, r.end) for r in preview.ranges)


def committed(result) -> list[tuple]:
    return sorted((r["topic"], r["partition"], r["start"], r["end"]) for r in result.ranges)


@pytest.fixture
def driver_ingestion(ingestion, spark):
    def build(table_uri, topics, kafka_config, **options):
        return ingestion(table_uri, topics, kafka_config, DriverSubmitter(spark), **options)
    return build


def test_a_new_table_then_a_caught_up_one(driver_ingestion, kafka_config, table_uri):
    topic = new_topic(kafka_config, 3)
    produce(kafka_config, topic, 30)
    tx = transactional_producer(kafka_config)
    tx.begin_transaction()
    for i in range(4):
        tx.produce(topic, value=b"aborted", partition=i % 3)
    tx.flush(30)
    tx.abort_transaction(30)
    ing = driver_ingestion(table_uri, topic, kafka_config)

    first = previewed(ing)
    assert first.action == "plan" and first.batch == 1 and first.mode == "offsets"
    assert first.records == 30 and first.offsets > 30  # the aborted records and the marker take offsets
    assert [s.role for s in first.sinks] == ["table"] and first.sinks[0].version is None
    assert not os.path.exists(table_uri)  # not even the table's directory
    assert "nothing was written" in first.lines()[-1]

    result = ing.run(RunIdentity("r1"))
    assert result.status == "committed" and committed(result) == spans(first) and result.rows == first.records

    caught_up = previewed(ing)
    assert caught_up.action == "nothing_new" and caught_up.ranges == () and caught_up.batch is None
    assert caught_up.sinks[0].version == 0 and caught_up.lag == {f"{topic}[{p}]": 0 for p in range(3)}
    again = previewed(ing, RunIdentity("r1"))  # the run key's batch is in the table: a retry starts nothing
    assert again.action == "already_committed" and again.batch == 1
    assert ing.run(RunIdentity("r2")).status == "nothing_new"


def test_an_interval_then_one_still_open(driver_ingestion, kafka_config, table_uri, kafka_broker):
    topic = new_topic(kafka_config, 2)
    hour = (int(time.time()) // 3600 - 2) * 3600 * 1000  # two hours ago, within the broker's retention
    stamps = [hour + i * 60_000 for i in range(60)] + [hour + 3600_000 + 1000] * 2  # past the end: it closes
    kafka_broker.produce(topic, [f"r{i}" for i in range(len(stamps))], timestamps=stamps)
    ing = driver_ingestion(table_uri, topic, kafka_config, mode="interval", close_after=3600.0)
    interval = interval_of(hour, hour + 3600_000)

    preview = previewed(ing, RunIdentity("h1"), interval)
    assert preview.action == "plan" and preview.interval == {"start_ms": hour, "end_ms": hour + 3600_000}
    assert preview.records == 60 and preview.mode == "interval"
    result = ing.run(RunIdentity("h1"), interval)
    assert result.status == "committed" and committed(result) == spans(preview) and result.rows == 60

    following = interval_of(hour + 3600_000, hour + 7200_000)  # holds the last two; no record past its end yet
    waiting = previewed(ing, RunIdentity("h2"), following)
    assert waiting.action == "waiting" and "is not closed yet" in waiting.waiting and waiting.ranges == ()
    assert previewed(ing, RunIdentity("h1"), interval).action == "already_committed"


def test_a_merge_table(ingestion, spark, kafka_config, table_uri, kafka_broker):
    from airflow_eo.driver.main import InProcessSubmitter

    topic = new_topic(kafka_config, 3)
    sql = ("SELECT CAST(key AS STRING) AS id, CAST(value AS STRING) AS v, topic, partition, offset FROM source")
    ing = ingestion(table_uri, topic, kafka_config, InProcessSubmitter(spark), write_mode="merge", merge_key="id",
                    transform_sql=sql)
    kafka_broker.produce_keyed(topic, [(f"k{i}", f"a{i}") for i in range(12)])
    assert ing.run(RunIdentity("m1")).status == "committed"
    kafka_broker.produce_keyed(topic, [("k1", "b1"), ("k2", None), ("k20", "b20")])

    preview = previewed(ing, RunIdentity("m2"))
    assert preview.action == "plan" and preview.batch == 2 and preview.records == 3 and preview.starts_spark
    assert [(s.role, s.write_mode, s.merge_key, s.version) for s in preview.sinks] == [("table", "merge", ("id",), 0)]
    result = ing.run(RunIdentity("m2"))
    assert committed(result) == spans(preview)
    assert (result.inserted, result.updated, result.deleted) == (1, 1, 1)


def test_the_command_line_with_dedup_and_avro_through_a_registry(kafka_config, tmp_path, capsys, ingestion, spark):
    """``airflow-eo plan --json``: the reader schema version pinned (read from the registry, nothing
    registered), the table and its dead-letter table as sinks, dedup named; then ``ingest`` with the
    same options commits the previewed ranges."""
    topic = new_topic(kafka_config, 2)
    table, dead = str(tmp_path / "orders"), str(tmp_path / "dead")
    with RegistryDouble() as registry:
        produce_avro(kafka_config, topic, [order(i) for i in range(10)], ORDER_SCHEMA, registry.config, partitions=2)
        registered = registry.requests["register"]
        options = ["--table", table, "--ingest-id", "orders", "--topics", topic,
                   "--bootstrap-servers", kafka_config["bootstrap.servers"], "--value-format", "avro",
                   "--dead-letter-table", dead, "--dedup-key", "offset", "--schema-registry", registry.url,
                   "--driver-read-max-offsets", "0", "--master", "local[2]"]
        before = (tree(table), tree(dead))
        assert main(["plan", *options, "--json"]) == 0
        assert (tree(table), tree(dead)) == before and registry.requests["register"] == registered
        preview = json.loads(capsys.readouterr().out)
        assert preview["action"] == "plan" and preview["records"] == 10 and preview["dedup_key"] == "offset"
        assert [(s["role"], s["uri"]) for s in preview["sinks"]] == [("table", table), ("dead_letters", dead)]
        assert [(s["column"], s["subject"], s["version"]) for s in preview["reader_schemas"]] == \
            [("value", f"{topic}-value", 1)]
        assert main(["plan", *options]) == 0  # the text form: one fact a line
        text = capsys.readouterr().out
        assert f"reader schema: value {topic}-value version 1" in text and "dedup by: offset" in text

        from airflow_eo.driver.main import InProcessSubmitter

        ing = ingestion(table, topic, kafka_config, InProcessSubmitter(spark), value_format="avro",
                        dead_letter_table_uri=dead, dedup_key="offset", schema_registry=registry.config)
        result = ing.run(RunIdentity("cli-1"))
    assert result.status == "committed" and committed(result) == sorted(
        (r["topic"], r["partition"], r["start"], r["end"]) for r in preview["ranges"])


def test_the_operators_dry_run(kafka_config, table_uri, capsys, airflow_db, kafka_broker):
    """Airflow's dry run of the task prints the preview, through the task's connections, writing nothing."""
    from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 8, partitions=2)
    task = KafkaToDeltaOperator(task_id="ingest", topics=[topic], table_uri=table_uri, ingest_id="orders")
    preview = task.dry_run()
    out = capsys.readouterr().out
    assert preview.action == "plan" and preview.records == 8 and not os.path.exists(table_uri)
    assert "orders (offsets mode), run (one-off): batch 1 would read 8 offsets, 8 records" in out
    assert f"{topic}[0] 0..4 (4 offsets, 4 records)" in out
