"""Change topics for the merge tests: a producer of inserts, updates and tombstones (plain and in
committed or aborted transactions), and the plain-Python model the table must equal.

The model is the pytest plugin's (airflow_eo/testing/assertions.py): it reads the broker with
kafka-python (read_committed), not with the pipeline's client, and applies the order rule as the
docs state it, batch by batch over the ranges the table's log says each batch committed: within a
partition the highest offset wins, across partitions the greatest (timestamp, partition, offset); a
winner that is a tombstone removes its key.

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
from airflow_eo.testing.assertions import expected_rows as plugin_expected_rows
from airflow_eo.testing.kafka import TestBroker
from airflow_eo.testing.tables import TestTable
from airflow_eo.testing.tables import read_table as plugin_read_table

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


def expected_rows(table_uri: str, ingest_id: str, bootstrap: str, topic: str,
                  storage_options: dict | None = None) -> dict[str, tuple]:
    """The model: the pytest plugin's (:func:`airflow_eo.testing.assertions.expected_rows`: the committed
    batches, by the ranges the table's log records, applied in order to the broker's visible records);
    id → (v, topic, partition, offset)."""
    rows = plugin_expected_rows(TestTable(table_uri, storage_options), TestBroker.connect(bootstrap), topic,
                                ingest_id=ingest_id, key_of=lambda r: r.key.decode(),
                                row_of=lambda r: {"v": json.loads(r.value)["v"], "topic": r.topic,
                                                  "partition": r.partition, "offset": r.offset})
    return {key: (row["v"], row["topic"], row["partition"], row["offset"]) for key, row in rows.items()}


def table_rows(table_uri: str, storage_options: dict | None = None) -> dict[str, tuple]:
    """id → (v, topic, partition, offset) of the table; fails on a key held twice."""
    table = plugin_read_table(TestTable(table_uri, storage_options), COLUMNS)  # as a Delta reader reads it
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
