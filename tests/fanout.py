"""Fan-out tests' topic and tables: mixed events, the sinks that split them, and each table's model.

A topic of mixed events: JSON values ``{"type": "a"|"b"|"c", "id": n, "n": seq}`` keyed by ``id``
(so one id's events share a partition), ``seq`` unique per record. One ingest reads it into four
tables (:func:`sinks`):

* ``raw`` — every record (append);
* ``current`` — the current row per ``id`` (write_mode=merge, merge_key id);
* ``type_a``, ``type_b`` — a table per event type, by the sink's ``filter`` (type ``c`` goes to none).

Each table is read with DuckDB's delta extension (delta-kernel: another Delta reader than the
pipeline's, :func:`tests.delta_tables.duckdb_rows`) and compared with its model, computed in plain
Python from the broker's read_committed records (kafka-python) below the offsets the table must have
committed; the offsets in its log (its ``txn`` actions) must be exactly those.

Example::

    >>> events = MixedEvents(broker, topic)                                   # doctest: +SKIP
    >>> events.send(range(30), types="abc"); events.send(range(5), types="a", abort=True)   # doctest: +SKIP
    >>> assert_tables(tables, broker, topic, ingest_id="fan", ends=broker.end_offsets(topic))  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from airflow_eo.testing.kafka import Record, TestBroker
from airflow_eo.testing.tables import TestTable
from tests.delta_tables import duckdb_rows

VALUE = "CAST(value AS STRING)"
RAW_SQL = f"SELECT topic, partition, offset, {VALUE} AS value FROM source"
CURRENT_SQL = (f"SELECT CAST(get_json_object({VALUE}, '$.id') AS BIGINT) AS id, get_json_object({VALUE}, '$.type') "
               f"AS type, CAST(get_json_object({VALUE}, '$.n') AS BIGINT) AS n, topic, partition, offset FROM source")


def type_filter(kind: str) -> str:
    """The sink filter that keeps events of type ``kind`` (a Spark SQL condition over the view ``source``)."""
    return f"get_json_object({VALUE}, '$.type') = '{kind}'"


@dataclass(frozen=True)
class Table:
    """One sink's table and the rows its model keeps: ``kind`` raw (every record), current (merge by
    id) or an event type (``a``, ``b``: the records of that type)."""

    name: str
    uri: str

    @property
    def sink(self) -> dict:
        """The sink's options, as a fan-out's ``sinks`` list takes them."""
        if self.name == "current":
            return {"table_uri": self.uri, "write_mode": "merge", "merge_key": "id", "transform_sql": CURRENT_SQL}
        if self.name == "raw":
            return {"table_uri": self.uri, "transform_sql": RAW_SQL}
        return {"table_uri": self.uri, "transform_sql": RAW_SQL, "filter": type_filter(self.name.removeprefix("type_"))}

    def expected(self, records: Sequence[Record], ends: Mapping[int, int],
                 starts: Mapping[int, int] | None = None) -> list[tuple]:
        """The rows the table must hold when it has read from ``starts`` (partition → offset; default
        the beginning) up to ``ends``."""
        below = [r for r in records if (starts or {}).get(r.partition, 0) <= r.offset < ends.get(r.partition, 0)]
        if self.name == "current":
            last: dict[int, Record] = {}
            for r in sorted(below, key=lambda r: r.offset):  # one id, one partition: the highest offset wins
                event = r.json()
                assert last.get(event["id"], r).partition == r.partition, "an id's events left its partition"
                last[event["id"]] = r
            return sorted((e["id"], e["type"], e["n"], r.topic, r.partition, r.offset)
                          for r, e in ((r, r.json()) for r in last.values()))
        kind = None if self.name == "raw" else self.name.removeprefix("type_")
        return sorted((r.topic, r.partition, r.offset, r.value.decode()) for r in below
                      if kind is None or r.json()["type"] == kind)

    def rows(self) -> list[tuple]:
        """The table's rows as DuckDB's delta extension reads them (none before its first commit)."""
        if not TestTable(self.uri).exists:
            return []
        columns = 'id, type, n, topic, "partition", "offset"' if self.name == "current" else \
            'topic, "partition", "offset", value'
        return sorted(duckdb_rows(self.uri, f"SELECT {columns} FROM t"))

    def offsets(self, ingest_id: str, topic: str, partitions: Iterable[int]) -> dict[int, int | None]:
        return TestTable(self.uri).committed_offsets(ingest_id, topic, list(partitions))


def tables(root: str, names: Sequence[str] = ("raw", "current", "type_a", "type_b")) -> list[Table]:
    return [Table(name, os.path.join(root, name)) for name in names]


def sinks(tables_: Iterable[Table]) -> list[dict]:
    return [t.sink for t in tables_]


class MixedEvents:
    """Writes mixed events to ``topic``: ``send(ids, types)`` gives each id one event per call, the
    records' types cycling through ``types``; ``abort=True`` sends them in an aborted transaction (they take
    offsets, no read_committed consumer sees them)."""

    def __init__(self, broker: TestBroker, topic: str):
        self.broker, self.topic, self.seq = broker, topic, 0

    def send(self, ids: Iterable[int], types: str = "abc", *, abort: bool = False, extra: Mapping | None = None) -> int:
        values, keys = [], []
        for id_ in ids:
            self.seq += 1
            values.append({"type": types[self.seq % len(types)], "id": id_, "n": self.seq, **(extra or {})})
            keys.append(str(id_))
        if abort:
            return self.broker.produce_transaction(self.topic, values, keys=keys, abort=True)
        return self.broker.produce(self.topic, values, keys=keys)


def assert_table(table: Table, broker: TestBroker, topic: str, *, ingest_id: str,
                 ends: Mapping[int, int] | None, starts: Mapping[int, int] | None = None,
                 keep: Callable[[Record], bool] | None = None) -> int:
    """``table`` holds exactly its model's rows from ``starts`` (its starting offsets; default the
    beginning) up to ``ends`` and its log's offsets are ``ends``; with ``ends`` None it has committed
    nothing (no offsets, no rows). ``keep``: the records rows are made of (the others are dead letters).
    Returns its row count."""
    partitions = broker.partitions(topic)
    committed = table.offsets(ingest_id, topic, partitions)
    if ends is None:
        want = {p: None for p in partitions}
    else:  # a partition still empty may carry no offset
        want = {p: ends.get(p, 0) for p in partitions}
        committed = {p: 0 if o is None and want[p] == 0 else o for p, o in committed.items()}
    assert committed == want, f"{table.name}: offsets {committed} in its log, expected {want}"
    got = table.rows()
    expected = table.expected([r for r in broker.records(topic) if keep is None or keep(r)], ends or {}, starts)
    if got != expected:
        missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        raise AssertionError(f"{table.name} ({table.uri}) differs from its model: {len(got)} rows, "
                             f"{len(expected)} expected; missing {missing[:5]}, unexpected {extra[:5]}")
    return len(got)


def assert_tables(tables_: Iterable[Table], broker: TestBroker, topic: str, *, ingest_id: str,
                  ends: Mapping[int, int] | None, keep: Callable[[Record], bool] | None = None) -> dict[str, int]:
    """:func:`assert_table` for each table; their row counts by name."""
    return {t.name: assert_table(t, broker, topic, ingest_id=ingest_id, ends=ends, keep=keep) for t in tables_}


def decodable(record: Record) -> bool:
    """Whether a record's value is a JSON object (else a decoding sink sends it to its dead letters)."""
    try:
        return isinstance(record.json(), dict)
    except ValueError:
        return False


def spec_file(path: str, options: Mapping) -> str:
    """``options`` (the operator's argument names, ``sinks`` a list) as the JSON file ``--spec`` reads."""
    with open(path, "w") as f:
        json.dump(dict(options), f)
    return path
