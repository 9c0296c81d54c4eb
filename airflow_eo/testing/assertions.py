"""The plugin's assertions: a table, read as a Delta reader reads it, against what the broker holds.

The table's rows are read through deltalake's QueryBuilder (:func:`airflow_eo.testing.tables.read_table`:
deletion vectors applied); its offsets are the ``txn`` actions of the ingest in its Delta log; the
broker's records are read with kafka-python (:meth:`airflow_eo.testing.kafka.TestBroker.records`),
another client than the pipeline's. Each assertion raises ``AssertionError`` naming what is wrong
(the first few coordinates of each kind) and returns a small summary when all holds.

* :func:`assert_exactly_once` — every record a read_committed consumer sees below the table's
  offsets is in the table (or its dead-letter table) exactly once, and nothing else is: no
  duplicate, no missing record, nothing of an aborted transaction, nothing past the offsets;
  ``caught_up=True`` adds :func:`assert_offsets_at_end`.
* :func:`assert_offsets_at_end` — the offsets in the log are each partition's last stable offset.
* :func:`assert_no_aborted_records` — no row comes from an aborted transaction.
* :func:`assert_last_write_per_key` — a merge table holds one row per key: its last change, by
  the order rule the docs state (docs/how-to/upserts.md), applied batch by batch over the ranges
  its log records; a key whose last change is a delete has no row.

The rows must keep the Kafka coordinates ``topic``, ``partition`` and ``offset`` (the transform
must keep them; a merge table's rows keep those of the change that wrote them).

Example::

    >>> assert_exactly_once(delta_table, kafka_broker, [topic], ingest_id="orders", caught_up=True)  # doctest: +SKIP
    TableCheck(rows=30, records=30, committed={'t-1a2b[0]': 10, 't-1a2b[1]': 10, 't-1a2b[2]': 10})
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_eo.testing.kafka import Record, TestBroker
from airflow_eo.testing.tables import TestTable, read_table, table_of

Coordinates = tuple[str, int, int]
COORDINATES = ["topic", "partition", "offset"]
SHOWN = 5  # coordinates named per kind of failure


@dataclass(frozen=True)
class TableCheck:
    """What a passing assertion checked: the table's ``rows`` (and dead letters), the broker's
    ``records`` they were compared with, the offsets the log holds (``"topic[p]"``: offset)."""

    rows: int
    records: int
    committed: dict[str, int | None]


def _name(c: Coordinates) -> str:
    return f"{c[0]}[{c[1]}]@{c[2]}"


def _some(items: Iterable[Coordinates]) -> str:
    shown = sorted(items)
    return ", ".join(_name(c) for c in shown[:SHOWN]) + (f" and {len(shown) - SHOWN} more" if len(shown) > SHOWN else "")


def _topics(topics: "str | Sequence[str]") -> list[str]:
    return [topics] if isinstance(topics, str) else list(topics)


def _require(table: TestTable) -> TestTable:
    """A table to judge: none at all means the ingest committed nothing, which no assertion passes."""
    if not table.exists:
        raise AssertionError(f"there is no Delta table at {table.uri}: the ingest never committed to it")
    return table


def _coordinates(table: TestTable) -> list[Coordinates]:
    read = read_table(table, COORDINATES)
    return list(zip(read["topic"].to_pylist(), read["partition"].to_pylist(), read["offset"].to_pylist()))


def _committed(table: TestTable, broker: TestBroker, topics: list[str], ingest_id: str) -> dict[tuple[str, int], int | None]:
    found = {}
    for topic in topics:
        for p, offset in table.committed_offsets(ingest_id, topic, broker.partitions(topic)).items():
            found[(topic, p)] = offset
    return found


def assert_exactly_once(table: "TestTable | str", broker: TestBroker, topics: "str | Sequence[str]", *,
                        ingest_id: str, dead_letter_table: "TestTable | str | None" = None,
                        caught_up: bool = False) -> TableCheck:
    """Every read_committed record below the offsets ``ingest_id`` committed in ``table`` is a row
    of it (or of ``dead_letter_table``: undecodable records, duplicates a dedup sent there) exactly
    once, and no row is anything else. ``caught_up``: the offsets are also the topics' ends."""
    t, names = table_of(table), _topics(topics)
    _require(t)
    committed = _committed(t, broker, names, ingest_id)
    held = _coordinates(t) + (_coordinates(table_of(dead_letter_table)) if dead_letter_table is not None else [])
    visible: set[Coordinates] = set()
    aborted: set[Coordinates] = set()
    for topic in names:
        seen = {r.coordinates for r in broker.records(topic)}
        visible |= seen
        aborted |= {r.coordinates for r in broker.records(topic, read_committed=False)} - seen
    expected = {c for c in visible if (end := committed.get((c[0], c[1]))) is not None and c[2] < end}
    counts = Counter(held)
    problems = []
    if twice := {c for c, n in counts.items() if n > 1}:
        problems.append(f"{len(twice)} record(s) held more than once: {_some(twice)}")
    if missing := expected - set(counts):
        problems.append(f"{len(missing)} committed record(s) missing: {_some(missing)}")
    if of_aborted := set(counts) & aborted:
        problems.append(f"{len(of_aborted)} row(s) of aborted transactions: {_some(of_aborted)}")
    if beyond := set(counts) - expected - aborted:
        problems.append(f"{len(beyond)} row(s) no committed offset covers (past the log's offsets, or not in "
                        f"the topics): {_some(beyond)}")
    if problems:
        raise AssertionError(f"{t.uri} is not exactly once with the broker: " + "; ".join(problems))
    check = TableCheck(len(held), len(expected), {f"{t_}[{p}]": o for (t_, p), o in sorted(committed.items())})
    if caught_up:
        assert_offsets_at_end(t, broker, names, ingest_id=ingest_id)
    return check


def assert_offsets_at_end(table: "TestTable | str", broker: TestBroker, topics: "str | Sequence[str]", *,
                          ingest_id: str) -> dict[str, int]:
    """The offsets ``ingest_id`` committed in ``table`` are each partition's last stable offset
    (the table has read everything committed to the topics)."""
    t, names = table_of(table), _topics(topics)
    committed = _committed(t, broker, names, ingest_id)
    ends = {(topic, p): end for topic in names for p, end in broker.end_offsets(topic).items()}
    behind = {f"{tp[0]}[{tp[1]}]": (committed.get(tp), end) for tp, end in sorted(ends.items())
              if committed.get(tp) != end and not (committed.get(tp) is None and end == 0)}
    if behind:
        raise AssertionError(f"{t.uri}: the offsets in the log are not the topics' ends (committed, end): "
                             + ", ".join(f"{k}: {v}" for k, v in list(behind.items())[:SHOWN]))
    return {f"{tp[0]}[{tp[1]}]": end for tp, end in sorted(ends.items())}


def assert_no_aborted_records(table: "TestTable | str", broker: TestBroker, topics: "str | Sequence[str]") -> int:
    """No row of ``table`` is a record of an aborted transaction; returns the rows checked."""
    t = table_of(table)
    held = set(_coordinates(t))
    for topic in _topics(topics):
        seen = {r.coordinates for r in broker.records(topic)}
        aborted = {r.coordinates for r in broker.records(topic, read_committed=False)} - seen
        if found := held & aborted:
            raise AssertionError(f"{t.uri} holds {len(found)} row(s) of aborted transactions: {_some(found)}")
    return len(held)


def _is_tombstone(record: Record) -> bool:
    return record.value is None


def expected_rows(table: "TestTable | str", broker: TestBroker, topics: "str | Sequence[str]", *, ingest_id: str,
                  key_of: Callable[[Record], Any], row_of: Callable[[Record], Mapping[str, Any]],
                  is_delete: Callable[[Record], bool] = _is_tombstone) -> dict[Any, dict[str, Any]]:
    """The rows a merge table must hold (key → row): the batches its log records, in order, each
    over the broker's read_committed records of its ranges; per key the batch's winner (the
    highest offset in a partition; across partitions the greatest (timestamp, partition, offset,
    topic)) replaces the key's row with ``row_of(record)``, or removes it when ``is_delete(record)``."""
    from airflow_eo.table.ledger import Ledger
    from airflow_eo.table.metadata import CommitKind

    t = table_of(table)
    visible = {r.coordinates: r for topic in _topics(topics) for r in broker.records(topic)}
    if not t.exists:
        return {}
    batches = sorted((b for b in Ledger.open(t.uri, t.options()).batches(ingest_id, limit=None)
                      if b.meta.operation is CommitKind.BATCH), key=lambda b: b.meta.batch)
    state: dict[Any, dict[str, Any]] = {}
    for batch in batches:
        by_key: dict[Any, dict[tuple[str, int], Record]] = {}
        for r in batch.meta.ranges:
            for offset in range(r.start, r.end):
                record = visible.get((r.topic, r.partition, offset))
                if record is not None:  # later offsets of a partition replace earlier ones
                    by_key.setdefault(key_of(record), {})[(record.topic, record.partition)] = record
        for key, lasts in by_key.items():
            winner = max(lasts.values(), key=lambda x: (x.timestamp, x.partition, x.offset, x.topic))
            if is_delete(winner):
                state.pop(key, None)
            else:
                state[key] = dict(row_of(winner))
    return state


def assert_last_write_per_key(table: "TestTable | str", broker: TestBroker, topics: "str | Sequence[str]", *,
                              ingest_id: str, key_columns: Sequence[str], key_of: Callable[[Record], Any],
                              row_of: Callable[[Record], Mapping[str, Any]],
                              is_delete: Callable[[Record], bool] = _is_tombstone) -> int:
    """A merge table holds one row per key, the last change of each (:func:`expected_rows`):
    ``key_of(record)`` is the key a record changes (as the row's ``key_columns`` hold it: one value, or a
    tuple of several), ``row_of(record)`` the row an upsert writes (the columns compared),
    ``is_delete(record)`` whether it deletes (default: a tombstone, the pipeline's default
    ``delete_when``). Returns the rows checked."""
    t = _require(table_of(table))
    expected = expected_rows(t, broker, topics, ingest_id=ingest_id, key_of=key_of, row_of=row_of, is_delete=is_delete)
    got_rows = read_table(t).to_pylist()

    def key(row: dict) -> Any:
        return row[key_columns[0]] if len(key_columns) == 1 else tuple(row[c] for c in key_columns)

    counts = Counter(key(r) for r in got_rows)
    problems = []
    if twice := sorted(k for k, n in counts.items() if n > 1):
        problems.append(f"{len(twice)} key(s) with more than one row: {twice[:SHOWN]}")
    got = {key(r): r for r in got_rows}
    if missing := sorted(set(expected) - set(got), key=str):
        problems.append(f"{len(missing)} key(s) without their row: {missing[:SHOWN]}")
    if extra := sorted(set(got) - set(expected), key=str):
        problems.append(f"{len(extra)} key(s) that should have no row (deleted, or never written): {extra[:SHOWN]}")
    wrong = {k: ({c: got[k].get(c) for c in row}, row) for k, row in expected.items()
             if k in got and any(got[k].get(c) != v for c, v in row.items())}
    if wrong:
        shown = "; ".join(f"{k}: has {has}, last change {want}" for k, (has, want) in list(wrong.items())[:SHOWN])
        problems.append(f"{len(wrong)} key(s) whose row is not their last change: {shown}")
    if problems:
        raise AssertionError(f"{t.uri} is not the last write per key: " + "; ".join(problems))
    return len(got_rows)
