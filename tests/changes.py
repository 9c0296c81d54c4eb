"""Change topics for the merge tests: a producer of inserts, updates and tombstones (plain and in
committed or aborted transactions), and the plain-Python model the table must equal.

The model reads the broker with kafka-python (read_committed), not with the pipeline's client,
and applies the order rule as the docs state it, batch by batch over the ranges the table's
log says each batch committed: within a partition the highest offset wins, across partitions
the greatest (timestamp, partition, offset); a winner that is a tombstone removes its key.

Example::

    >>> changes = ChangeProducer(config, topic)                      # doctest: +SKIP
    >>> changes.write(range(100)); changes.delete([3, 4]); changes.flush()   # doctest: +SKIP
    >>> assert table_rows(uri) == expected_rows(uri, "test", bootstrap, topic)   # doctest: +SKIP
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter

from confluent_kafka import Producer
from deltalake import DeltaTable

from airflow_eo.table.ledger import Ledger
from airflow_eo.table.metadata import CommitKind
from tests.helpers import read_table, visible_records

PARTITIONS = 3
# the merge tests' transform: the key from the Kafka key (so tombstones have one), the value's v
SQL = ("SELECT CAST(key AS STRING) AS id, CAST(get_json_object(CAST(value AS STRING), '$.v') AS BIGINT) AS v, "
       "topic, partition, offset FROM source")
COLUMNS = ["id", "v", "topic", "partition", "offset"]


class ChangeProducer:
    """Changes of keys ``"0"``, ``"1"``…: a key's records go to partition ``id % 3`` unless moved;
    every record carries an explicit, increasing timestamp; values are ``{"v": n}`` with a
    counter ``n``, so each record's value is unique."""

    def __init__(self, config: dict, topic: str, partitions: int = PARTITIONS):
        self.config, self.topic, self.partitions = config, topic, partitions
        self.producer = Producer({**config, "enable.idempotence": True, "linger.ms": 5})
        self.moved: dict[int, int] = {}  # key -> partition it now goes to
        self.n = 0
        self.clock = int(time.time() * 1000) - 60_000  # within retention, increasing

    def partition_of(self, key: int) -> int:
        return self.moved.get(key, key % self.partitions)

    def _send(self, producer: Producer, key: int, value: bytes | None) -> None:
        self.clock += 1
        producer.produce(self.topic, key=str(key).encode(), value=value, partition=self.partition_of(key),
                         timestamp=self.clock)

    def _value(self) -> bytes:
        self.n += 1
        return json.dumps({"v": self.n}).encode()

    def write(self, keys) -> None:
        for key in keys:
            self._send(self.producer, key, self._value())

    def delete(self, keys) -> None:
        for key in keys:
            self._send(self.producer, key, None)

    def transaction(self, writes, deletes=(), abort: bool = False) -> None:
        """Writes and tombstones in one transaction, committed or aborted (aborted: never visible)."""
        tx = Producer({**self.config, "transactional.id": f"merge-tx-{uuid.uuid4().hex[:8]}"})
        tx.init_transactions(30)
        tx.begin_transaction()
        for key in writes:
            self._send(tx, key, self._value())
        for key in deletes:
            self._send(tx, key, None)
        if abort:  # not flushed first: noida-db lists a flushed aborted transaction wrongly (tests/system/faults)
            tx.abort_transaction(30)
        else:
            tx.commit_transaction(30)

    def flush(self) -> None:
        self.producer.flush(30)


def broker_changes(bootstrap: str, topic: str) -> dict[tuple[int, int], tuple[str, bytes | None, int]]:
    """Every visible record: (partition, offset) → (key, value, timestamp ms), read_committed, with
    kafka-python (not the pipeline's client)."""
    return {(r.partition, r.offset): (r.key.decode(), r.value, r.timestamp) for r in visible_records(bootstrap, topic)}


def winner_of(records: list[tuple]) -> tuple:
    """records of one key in one batch, as (partition, offset, timestamp, value): the order rule."""
    lasts: dict[int, tuple] = {}
    for r in records:
        if r[0] not in lasts or r[1] > lasts[r[0]][1]:
            lasts[r[0]] = r
    return max(lasts.values(), key=lambda r: (r[2], r[0], r[1]))


def expected_rows(table_uri: str, ingest_id: str, bootstrap: str, topic: str,
                  storage_options: dict | None = None) -> dict[str, tuple]:
    """The model: the committed batches (their ranges, from the table's log) applied in order to
    the broker's visible records; id → (v, topic, partition, offset)."""
    visible = broker_changes(bootstrap, topic)
    batches = sorted((b for b in Ledger.open(table_uri, storage_options).batches(ingest_id, limit=None)
                      if b.meta.operation is CommitKind.BATCH), key=lambda b: b.meta.batch)
    state: dict[str, tuple] = {}
    for b in batches:
        by_key: dict[str, list] = {}
        for r in b.meta.ranges:
            for offset in range(r.start, r.end):
                found = visible.get((r.partition, offset))
                if found is not None:
                    key, value, ts = found
                    by_key.setdefault(key, []).append((r.partition, offset, ts, value))
        for key, records in by_key.items():
            partition, offset, _, value = winner_of(records)
            if value is None:
                state.pop(key, None)
            else:
                state[key] = (json.loads(value)["v"], topic, partition, offset)
    return state


def table_rows(table_uri: str, storage_options: dict | None = None) -> dict[str, tuple]:
    """id → (v, topic, partition, offset) of the table; fails on a key held twice."""
    if storage_options:  # the snapshot's files through the table's own filesystem
        import pyarrow.dataset as pads

        from airflow_eo.table.storage import TableLocation

        files = DeltaTable(table_uri, storage_options=storage_options).file_uris()
        table = pads.dataset([f.split("://", 1)[1] for f in files], format="parquet",
                             filesystem=TableLocation.of(table_uri, storage_options).fs).to_table(columns=COLUMNS)
    else:
        table = read_table(table_uri, COLUMNS)
    ids = table["id"].to_pylist()
    twice = {k: n for k, n in Counter(ids).items() if n > 1}
    assert not twice, f"keys held twice: {dict(list(twice.items())[:5])}"
    return {r["id"]: (r["v"], r["topic"], r["partition"], r["offset"]) for r in table.to_pylist()}


def assert_model_holds(table_uri: str, ingest_id: str, bootstrap: str, topic: str,
                       storage_options: dict | None = None) -> int:
    """The table equals the model, and the offsets in the log are the last batch's ends."""
    expected = expected_rows(table_uri, ingest_id, bootstrap, topic, storage_options)
    got = table_rows(table_uri, storage_options)
    missing, extra = set(expected) - set(got), set(got) - set(expected)
    wrong = {k: (got[k], expected[k]) for k in set(got) & set(expected) if got[k] != expected[k]}
    assert not (missing or extra or wrong), (f"missing {sorted(missing)[:5]}, extra {sorted(extra)[:5]}, "
                                             f"wrong {dict(list(wrong.items())[:5])}")
    ledger = Ledger.open(table_uri, storage_options)
    last = ledger.find_batch(ingest_id, batch=ledger.last_batch(ingest_id))
    if last is not None:
        ends = {r.tp: r.end for r in last.meta.ranges}
        assert ledger.committed_offsets(ingest_id, list(ends)) == ends
    return len(got)


def table_version(table_uri: str, storage_options: dict | None = None) -> int:
    return DeltaTable(table_uri, storage_options=storage_options).version()
