"""The plan preview over a table and Kafka held in memory: the same plan the ingest's step 1 makes,
each kind of next step, its text and JSON forms, and nothing written (the whole tree hashed).
The real broker, intervals, merge tables and the command line: tests/integration/test_plan_preview.py."""

from __future__ import annotations

import hashlib
import json
import os

from airflow_eo.loop.ingest import Ingestion
from airflow_eo.core.offsets import RunIdentity, TopicPartition
from airflow_eo.loop.preview import NO_SPARK, plan_preview
from airflow_eo.table.app_ids import batch_app_id, partition_app_id
from tests.conftest import build_config
from tests.unit.fakes import FakeKafka, Txn, ledger_table

T0, T1 = TopicPartition("orders", 0), TopicPartition("orders", 1)


def tree(path: str) -> dict[str, str]:
    return {os.path.relpath(os.path.join(root, f), path): hashlib.sha256(open(os.path.join(root, f), "rb").read())
            .hexdigest() for root, _, files in os.walk(path) for f in files}


def setup(tmp_path, *committed: int, **options):
    """A table that committed ``committed`` (p0, p1) in batch 3, and Kafka holding 10 and 7 records."""
    uri = str(tmp_path / "orders")
    if committed:
        ledger_table(uri, Txn(batch_app_id("orders_raw"), 3),
                     *(Txn(partition_app_id("orders_raw", tp), v) for tp, v in zip((T0, T1), committed)))
    kafka = FakeKafka(orders=2)
    kafka.produce(T0, *range(10))
    kafka.produce(T1, *range(7))
    config = build_config(uri, "orders", {"bootstrap.servers": "fake:9092"}, ingest_id="orders_raw", **options)
    return Ingestion(config, NO_SPARK, kafka=kafka), uri


def test_the_next_batch_is_the_planners_and_nothing_is_written(tmp_path):
    ingestion, uri = setup(tmp_path, 4, 7, max_records_per_run=5)
    before = tree(uri)
    preview = plan_preview(ingestion, RunIdentity("dag/run/ingest/-1"), count_records=False)
    assert tree(uri) == before
    plan = ingestion.plan(RunIdentity("dag/run/ingest/-1"))
    assert preview.action == "plan" and preview.batch == plan.batch == 4
    assert [(r.partition, r.start, r.end, r.offsets) for r in preview.ranges] == \
        [(r.partition, r.start, r.end, r.size) for r in plan.data_ranges] == [(0, 4, 9, 5)]
    assert preview.records is None and preview.offsets == 5 and preview.lag == {"orders[0]": 6, "orders[1]": 0}
    assert [s.role for s in preview.sinks] == ["table"] and preview.sinks[0].version == 0
    assert json.loads(json.dumps(preview.to_dict()))["sinks"][0]["uri"] == uri
    assert preview.lines()[:2] == ["orders_raw (offsets mode), run dag/run/ingest/-1: batch 4 would read 5 offsets",
                                   "  orders[0] 4..9 (5 offsets)"]


def test_a_caught_up_table_has_nothing_new_and_a_new_one_names_its_dead_letter_table(tmp_path):
    ingestion, _ = setup(tmp_path, 10, 7)
    assert plan_preview(ingestion, RunIdentity(""), count_records=False).action == "nothing_new"
    fresh, uri = setup(tmp_path / "new", dead_letter_table_uri=str(tmp_path / "dead"), value_schema="id INT")
    preview = plan_preview(fresh, RunIdentity(""), count_records=False)
    assert preview.batch == 1 and preview.new_partitions == ("orders[0]", "orders[1]") and preview.starts_spark
    assert [(s.role, s.version) for s in preview.sinks] == [("table", None), ("dead_letters", None)]
    assert not os.path.exists(uri) and not os.path.exists(tmp_path / "dead")


def test_a_logged_plan_is_previewed_as_its_replay(tmp_path):
    ingestion, uri = setup(tmp_path, 4, 7)
    run = RunIdentity("dag/run/ingest/-1")
    ingestion.plans.record(ingestion.plan(run))  # a first try logged its plan, then died
    preview = plan_preview(ingestion, run, count_records=False)
    assert preview.action == "replay" and [(r.start, r.end) for r in preview.ranges] == [(4, 10)]
    assert "(the run's logged plan) would be read again" in preview.lines()[0]


def test_a_preview_neither_waits_for_nor_takes_the_tables_lease(tmp_path, monkeypatch):
    """A run holds the table's lease (runs take turns before they plan): the preview of another run shows
    its next batch at once, leaves the lease to its holder and passes no fault point of the run's."""
    import time

    import airflow_eo.loop.ingest as ingest_module

    ingestion, uri = setup(tmp_path, 4, 7, table_wait_timeout="10m")
    reached: list[str] = []
    monkeypatch.setattr(ingest_module, "failpoint", reached.append)
    with ingestion.turn("dag/other/ingest/-1") as held:
        assert held is not None
        before = tree(uri)
        started = time.monotonic()
        preview = plan_preview(ingestion, RunIdentity("dag/run/ingest/-1"), count_records=False)
        assert time.monotonic() - started < 30  # it did not queue behind the holder (that would take 10 minutes)
        assert tree(uri) == before and preview.action == "plan" and preview.batch == 4
        _, holder = ingestion.lease().newest()
        assert holder is not None and holder.run_key == "dag/other/ingest/-1" and holder.released_at is None
    assert reached == []
