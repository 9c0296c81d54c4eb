"""The consumer-group mirror: lag tools see the table's offsets; a broken mirror never
fails a batch and the next run corrects it."""

from __future__ import annotations

import logging

from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from airflow_eo.demo.broker import EmbeddedBroker
from airflow_eo.loop.ingest import Ingestion
from airflow_eo.loop.config import IngestConfig
from airflow_eo.table.ledger import Ledger
from airflow_eo.loop.mirror import mirror_offsets
from airflow_eo.core.offsets import RunIdentity, TopicPartition
from airflow_eo.driver.main import InProcessSubmitter
from tests.helpers import new_topic, produce

GROUP = "orders-lake-mirror"


def group_offsets(config: dict, group: str, topic: str, partitions: int) -> dict[int, int]:
    """What `kafka-consumer-groups --describe` would show as CURRENT-OFFSET."""
    consumer = Consumer({**config, "group.id": group, "enable.auto.commit": False})
    try:
        found = consumer.committed([KafkaTopicPartition(topic, p) for p in range(partitions)], timeout=20)
        return {tp.partition: tp.offset for tp in found if tp.offset >= 0}
    finally:
        consumer.close()


def table_offsets(table: str, ingest_id: str, topic: str, partitions: int) -> dict[int, int]:
    ledger = Ledger.open(table)
    committed = ledger.committed_offsets(ingest_id, [TopicPartition(topic, p) for p in range(partitions)])
    return {tp.partition: off for tp, off in committed.items() if off is not None}


class StopBrokerAfterSubmit:
    """The real in-process Spark attempt, then the broker goes down before the mirror runs."""

    def __init__(self, spark, broker: EmbeddedBroker):
        self.inner = InProcessSubmitter(spark)
        self.broker = broker

    def submit(self, attempt, secrets) -> None:
        self.inner.submit(attempt, secrets)
        self.broker.stop()


def test_mirror_follows_the_table_and_survives_a_broker_outage(spark, tmp_path, caplog):
    table = str(tmp_path / "table")
    with EmbeddedBroker() as broker:
        config = dict(broker.config)
        topic = new_topic(config, partitions=2)
        produce(config, topic, 40, partitions=2)
        ingest = IngestConfig(table_uri=table, ingest_id="mirrored", topics=[topic], kafka_config=config,
                              max_records_per_run=20, mirror_consumer_group=GROUP)

        first = Ingestion(ingest, InProcessSubmitter(spark)).run(RunIdentity("m-1"))
        assert first.status == "committed"
        assert group_offsets(config, GROUP, topic, 2) == table_offsets(table, "mirrored", topic, 2) == {0: 10, 1: 10}

        # broker down between the commit and the mirror: the batch still succeeds
        with caplog.at_level(logging.WARNING, logger="airflow_eo.loop.mirror"):
            second = Ingestion(ingest, StopBrokerAfterSubmit(spark, broker)).run(RunIdentity("m-2"))
        assert second.status == "committed" and second.rows == 20
        assert any("mirror" in r.getMessage() and "next run" in r.getMessage() for r in caplog.records)
        broker.start()
        assert group_offsets(config, GROUP, topic, 2) == {0: 10, 1: 10}  # the mirror lags the table

        # the next run, even with nothing new to read, brings the mirror up to the table
        third = Ingestion(ingest, InProcessSubmitter(spark)).run(RunIdentity("m-3"))
        assert third.status == "nothing_new"
        assert group_offsets(config, GROUP, topic, 2) == table_offsets(table, "mirrored", topic, 2) == {0: 20, 1: 20}


def test_mirror_is_off_by_default_and_reports_failure_without_raising(kafka_config):
    assert IngestConfig(table_uri="/tmp/x", ingest_id="x", topics=["t"], kafka_config={}).spec.source.mirror_consumer_group is None
    assert mirror_offsets({"bootstrap.servers": "127.0.0.1:1"}, GROUP, {TopicPartition("t", 0): 5}, timeout=2) is False
    topic = new_topic(kafka_config, partitions=1)
    assert mirror_offsets(kafka_config, "direct-mirror", {TopicPartition(topic, 0): 0, TopicPartition(topic, 1): None})
    assert group_offsets(kafka_config, "direct-mirror", topic, 1) == {0: 0}
