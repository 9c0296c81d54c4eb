"""The lag the status, the sensor and the metrics report, from Kafka held in memory and a real ledger."""

from __future__ import annotations

from airflow_eo.core.planning import StartingPosition
from airflow_eo.core.offsets import TopicPartition
from airflow_eo.status import lag_of
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.app_ids import batch_app_id, partition_app_id
from tests.unit.fakes import FakeKafka, Txn, ledger_table

A, B = TopicPartition("orders", 0), TopicPartition("orders", 1)


def kafka() -> FakeKafka:
    fake = FakeKafka(orders=2)
    fake.produce(A, *range(1000, 1010))
    fake.produce(B, *range(2000, 2004))
    return fake


def test_lag_is_what_kafka_holds_beyond_the_committed_offsets(tmp_path):
    uri = str(tmp_path / "t")
    ledger_table(uri, Txn(batch_app_id("orders_raw"), 1), Txn(partition_app_id("orders_raw", A), 6),
                 Txn(partition_app_id("orders_raw", B), 4))
    fake = kafka()
    assert lag_of(fake, fake.bounds([A, B]), Ledger.open(uri), "orders_raw") == {A: 4, B: 0}


def test_a_table_never_written_lags_by_what_its_start_would_read(tmp_path):
    fake, ledger = kafka(), Ledger.open(str(tmp_path / "new"))
    bounds = fake.bounds([A, B])
    assert lag_of(fake, bounds, ledger, "orders_raw") == {A: 10, B: 4}
    assert lag_of(fake, bounds, ledger, "orders_raw", StartingPosition("latest")) == {A: 0, B: 0}
    fake.delete_records(A, 8)  # retention: only what is left can be read
    assert lag_of(fake, fake.bounds([A, B]), ledger, "orders_raw") == {A: 2, B: 4}


def test_status_names_the_runs_holding_the_tables_lease(tmp_path):
    import json
    import socket

    from airflow_eo.status import table_status
    from airflow_eo.table.lease import Claim, LeasePurpose, TableLease
    from airflow_eo.table.storage import TableLocation

    uri = str(tmp_path / "t")
    ledger_table(uri, Txn(batch_app_id("orders_raw"), 1), Txn(partition_app_id("orders_raw", A), 6))
    assert table_status(uri, "orders_raw", None).to_dict()["lease"] is None
    held = TableLease(TableLocation.of(uri)).try_take(Claim(LeasePurpose.REPROCESS, "dag/fix/ingest/-1", "orders_raw"))
    held.attempt("0123456789abcdef")
    try:
        shown = json.loads(json.dumps(table_status(uri, "orders_raw", None).to_dict()))["lease"]
    finally:
        held.release()
    assert (shown["purpose"], shown["run_key"], shown["attempt_id"], shown["host"]) == \
        ("reprocess", "dag/fix/ingest/-1", "0123456789abcdef", socket.gethostname())
    assert shown["since"].endswith("Z") and shown["renewed"] >= shown["since"]
    assert table_status(uri, "orders_raw", None).lease is None  # released
