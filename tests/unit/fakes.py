"""Fakes at the unit lane's boundaries: Kafka's offsets held in memory, small Delta ledgers.

``FakeKafka`` answers the questions the planners ask a cluster (partitions, bounds, offsets
by timestamp, newest timestamps) from record timestamps kept in a list per partition; the
rest of :class:`airflow_eo.kafka.KafkaOffsets` (``resolve_starts``) is the real code.
``answering_from`` puts every client (a run's :class:`airflow_eo.kafka.PinnedKafka` too) in front
of one ``FakeKafka``, so a run's pinning is the real code as well.
``ledger_table`` writes a Delta table whose log holds given ``txn`` versions, as a table
airflow-eo committed to would.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import CommitProperties, Transaction

from airflow_eo.core.errors import KafkaUnavailableError
from airflow_eo.kafka import KafkaOffsets
from airflow_eo.core.offsets import PartitionBounds, RecordStamp, TopicPartition


class FakeKafka(KafkaOffsets):
    """A cluster in memory: per partition the timestamps (epoch ms) of its records, by offset."""

    def __init__(self, **topics: int):
        self.config = {"bootstrap.servers": "fake:9092"}
        self.timeout = 0.0
        self.records: dict[TopicPartition, list[int]] = {
            TopicPartition(t, p): [] for t, n in topics.items() for p in range(n)}
        self.log_start: dict[TopicPartition, int] = dict.fromkeys(self.records, 0)
        self.ids: dict[str, str | None] = dict.fromkeys(topics)  # topic ids (None: the broker reports none)
        self.asked: list[str] = []  # which questions were asked, in order

    def recreate(self, topic: str, partitions: int, topic_id: str | None = None) -> None:
        """Delete ``topic`` and create it again, empty, with ``partitions`` partitions (and ``topic_id``)."""
        for tp in [tp for tp in self.records if tp.topic == topic]:
            del self.records[tp], self.log_start[tp]
        for p in range(partitions):
            self.records[TopicPartition(topic, p)] = []
            self.log_start[TopicPartition(topic, p)] = 0
        self.ids[topic] = topic_id

    def add_partitions(self, topic: str, total: int) -> None:
        """CreatePartitions: ``topic`` grows to ``total`` partitions."""
        for p in range(total):
            self.records.setdefault(TopicPartition(topic, p), [])
            self.log_start.setdefault(TopicPartition(topic, p), 0)

    def produce(self, tp: TopicPartition, *timestamps_ms: int) -> None:
        self.records[tp].extend(timestamps_ms)

    def delete_records(self, tp: TopicPartition, before: int) -> None:
        """Retention: offsets below ``before`` are gone."""
        self.log_start[tp] = before

    def metadata(self) -> SimpleNamespace:
        """What AdminClient.list_topics answers, as far as the planners read it (topics, partitions, errors)."""
        self.asked.append("metadata")
        topics: dict[str, set[int]] = {}
        for tp in self.records:
            topics.setdefault(tp.topic, set()).add(tp.partition)
        return SimpleNamespace(topics={t: SimpleNamespace(partitions=dict.fromkeys(sorted(ps)), error=None)
                                       for t, ps in topics.items()})

    def partitions(self, topics: list[str]) -> list[TopicPartition]:
        self.asked.append("partitions")
        found = []
        for topic in topics:
            mine = sorted(tp for tp in self.records if tp.topic == topic)
            if not mine:
                raise KafkaUnavailableError(f"topic {topic!r} does not exist on fake:9092")
            found += mine
        return found

    def bounds(self, tps: list[TopicPartition]) -> dict[TopicPartition, PartitionBounds]:
        self.asked.append("bounds")
        return {tp: PartitionBounds(tp, self.log_start[tp], len(self.records[tp])) for tp in tps}

    def offsets_for_timestamp(self, tps: list[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int]:
        self.asked.append(f"offsets_for_timestamp({timestamp_ms})")
        found = {}
        for tp in tps:
            offsets = range(self.log_start[tp], len(self.records[tp]))
            found[tp] = next((o for o in offsets if self.records[tp][o] >= timestamp_ms), -1)
        return found

    def topic_ids(self, topics: list[str]) -> dict[str, str | None]:
        self.asked.append("topic_ids")
        return {t: self.ids.get(t) for t in topics}

    def _stamp(self, tp: TopicPartition, offset: int) -> RecordStamp:
        return RecordStamp(offset, self.records[tp][offset])

    def records_at(self, offsets, timeout: float = 5.0):
        self.asked.append("records_at")
        return {tp: self._stamp(tp, o) if tp in self.records and self.log_start[tp] <= o < len(self.records[tp])
                else None for tp, o in offsets.items()}

    def last_records(self, ends, look_back: int = 32, log_starts=None, timeout: float = 5.0):
        self.asked.append("last_records")
        return {tp: self._stamp(tp, end - 1) if tp in self.records and self.log_start[tp] < end <= len(self.records[tp])
                else None for tp, end in ends.items()}

    def newest_timestamps(self, bounds, look_back: int = 10, timeout: float = 5.0):
        self.asked.append("newest_timestamps")
        return {tp: max(self.records[tp][max(b.log_start, b.end - look_back):b.end], default=None)
                for tp, b in bounds.items()}


ASKED_OF_THE_CLUSTER = ("metadata", "partitions", "bounds", "offsets_for_timestamp", "topic_ids", "records_at",
                        "last_records", "newest_timestamps")


def answering_from(fake: FakeKafka, monkeypatch) -> None:
    """Every :class:`KafkaOffsets` made from now on (a run's pinned client too) asks ``fake``, not a broker."""
    def init(self, config, timeout=30.0):
        self.config, self.timeout = dict(config), timeout

    monkeypatch.setattr(KafkaOffsets, "__init__", init)
    for name in ASKED_OF_THE_CLUSTER:
        monkeypatch.setattr(KafkaOffsets, name, lambda self, *args, _name=name, **kwargs:
                            getattr(FakeKafka, _name)(fake, *args, **kwargs))


@dataclass(frozen=True)
class Txn:
    """One ``txn`` action: app id and version."""

    app_id: str
    version: int


def ledger_table(uri: str, *txns: Txn, rows: pa.Table | None = None) -> DeltaTable:
    """A Delta table at ``uri`` whose latest commit carries ``txns`` (and appends ``rows``)."""
    data = rows if rows is not None else pa.table({"topic": pa.array([], pa.string()),
                                                   "partition": pa.array([], pa.int32()),
                                                   "offset": pa.array([], pa.int64())})
    write_deltalake(uri, data, mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(t.app_id, t.version)
                                                                         for t in txns]))
    return DeltaTable(uri)


class BatchLog:
    """A Delta table whose commits are airflow-eo batch commits without data files: each carries
    its ``txn`` actions (offsets at the plan's ends, the batch counter; interval mode's as the
    interval ledger writes them) and its :class:`~airflow_eo.table.metadata.BatchMetadata`."""

    def __init__(self, uri: str):
        from airflow_eo.driver.reader import KAFKA_SCHEMA
        from airflow_eo.table.schema import delta_schema_of

        self.uri, self.schema = uri, delta_schema_of(KAFKA_SCHEMA)
        self.table = DeltaTable.create(uri, self.schema)

    def commit(self, meta=None, txns: list[Transaction] | tuple = ()) -> int:
        """One commit (``meta``: a BatchMetadata, or None for a commit of someone else); its version."""
        from airflow_eo.table.metadata import METADATA_KEY

        self.table.create_write_transaction([], mode="append", schema=self.schema, commit_properties=CommitProperties(
            app_transactions=list(txns) or None, custom_metadata={METADATA_KEY: meta.to_json()} if meta else None))
        self.table.update_incremental()
        return self.table.version()

    def batch(self, plan, rows: dict[str, int] | None = None, findings=None, kind=None) -> int:
        """The commit of ``plan`` (a BatchPlan) with ``rows`` per partition, as the commit rules write it."""
        from airflow_eo.table.intervals import IntervalLedger
        from airflow_eo.table.ledger import Ledger
        from airflow_eo.table.app_ids import batch_app_id, partition_app_id, reprocess_app_id
        from airflow_eo.table.metadata import BatchMetadata, CommitKind

        kind = kind or CommitKind.BATCH
        meta = BatchMetadata.of(kind, plan, rows_per_partition=rows or {}, findings=findings)
        if kind is CommitKind.REPROCESS:  # replaces the batch's rows: no offset or counter moves
            return self.commit(meta, [Transaction(reprocess_app_id(plan.ingest_id, plan.batch), 1)])
        if plan.interval is not None:
            txns = IntervalLedger(Ledger.open(self.uri), plan.ingest_id).transactions(plan)
        else:
            txns = [Transaction(partition_app_id(plan.ingest_id, r.tp), r.end) for r in plan.ranges]
        return self.commit(meta, [*txns, Transaction(batch_app_id(plan.ingest_id), plan.batch)])
