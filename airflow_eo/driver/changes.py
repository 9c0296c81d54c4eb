"""A batch's changes by key: which record of a key wins (the order rule), in Arrow.

Among the records of one key in a batch:

1. within one partition the record with the **highest offset** wins: Kafka orders a
   partition, and a producer that keys by the row's key sends its changes there in order
   (record timestamps need not be: ``CreateTime`` is the producer's clock);
2. when the key appears in several partitions (a producer changed its partitioner, or
   several producers write one table) there is no order between partitions, so the
   partitions' last records are compared by **(Kafka timestamp, partition, offset)**, the
   greatest wins: the timestamp is the best evidence of which change came later, and
   partition and offset make the choice the same on every replay. The topic breaks a last
   tie (several topics into one table).

The winner upserts its key's row, or deletes it when it is a delete (``delete_when``).
Batches commit in offset order, so a later batch's winner replaces an earlier one's.

:func:`airflow_eo.driver.merge.winners` applies the rule inside Spark (two aggregations, each
combined in the read tasks before its shuffle: a producer keyed by the row's key sends a key's changes
to one partition, so about one row per key is shuffled); :func:`select_winners` is the rule in Arrow,
its reference in the tests. Records with a null key column are the caller's to refuse.

Example::

    >>> import pyarrow as pa
    >>> batch = pa.table({"id": [1, 1, 1], "topic": ["t"] * 3, "partition": [0, 0, 1],
    ...                   "offset": [5, 7, 3], TS_COLUMN: [100, 90, 95]})
    >>> select_winners(batch, ("id",)).select(["partition", "offset", CHANGES_COLUMN]).to_pylist()
    [{'partition': 1, 'offset': 3, '_airflow_eo_changes': 3}]
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

TS_COLUMN = "_airflow_eo_ts"  # the record's Kafka timestamp, epoch ms (the cross-partition order)
CHANGES_COLUMN = "_airflow_eo_changes"  # on a winner: how many records of the batch its key had
# the cross-partition order, greatest first: what the docs call (timestamp, partition, offset)
ORDER = (TS_COLUMN, "partition", "offset", "topic")
_ROW = "_airflow_eo_winner"


def _starts(table: pa.Table, columns: list[str]) -> pa.Array:
    """True where a row starts a new group of equal ``columns`` values (``table`` sorted by them)."""
    n = table.num_rows
    if n == 0:
        return pa.array([], pa.bool_())
    differs = pa.array([False] * (n - 1), pa.bool_())
    for c in columns:
        column = table[c].combine_chunks()
        differs = pc.or_(differs, pc.fill_null(pc.not_equal(column.slice(1), column.slice(0, n - 1)), True))
    return pa.concat_arrays([pa.array([True]), differs])


def _split_keyless(table: pa.Table, key: tuple[str, ...]) -> tuple[pa.Table, pa.Table]:
    """(the rows whose key has no null column, the others)."""
    null_key = pa.array([False] * table.num_rows, pa.bool_())
    for c in key:
        null_key = pc.or_(null_key, pc.is_null(table[c]))
    return table.filter(pc.invert(null_key)), table.filter(null_key)


def _counted(winners: pa.Table, counts: pa.Table, key: tuple[str, ...], columns: list[str]) -> pa.Table:
    """``winners`` (one row per group of ``key``) with ``counts``' :data:`CHANGES_COLUMN`, joined by the key and a
    row number only: Arrow's join carries no list or map column along."""
    rows = pa.table({**{c: winners[c] for c in key}, _ROW: pa.array(range(winners.num_rows), pa.int64())})
    joined = rows.join(counts, keys=list(key), join_type="inner")
    return winners.take(joined[_ROW]).select(columns).append_column(CHANGES_COLUMN, joined[CHANGES_COLUMN])


def select_winners(table: pa.Table, key: tuple[str, ...]) -> pa.Table:
    """One row per key (the order rule above) with :data:`CHANGES_COLUMN`; rows whose key has a
    null column pass through one by one. The columns keep their order."""
    columns = table.column_names
    if table.num_rows == 0:
        return table.append_column(CHANGES_COLUMN, pa.array([], pa.int64()))
    table, keyless = _split_keyless(table, key)
    # 1. each partition's last record of a key
    by_partition = table.sort_by([*((c, "ascending") for c in key), ("topic", "ascending"),
                                  ("partition", "ascending"), ("offset", "descending")])
    lasts = by_partition.filter(_starts(by_partition, [*key, "topic", "partition"]))
    # 2. across partitions: the greatest (timestamp, partition, offset, topic); nulls last
    ranked = lasts.sort_by([*((c, "ascending") for c in key), *((c, "descending") for c in ORDER)])
    winners = ranked.filter(_starts(ranked, list(key)))
    counts = table.group_by(list(key)).aggregate([([], "count_all")]).rename_columns([*key, CHANGES_COLUMN])
    winners = _counted(winners, counts, key, columns)
    keyless = keyless.select(columns).append_column(CHANGES_COLUMN, pa.array([1] * keyless.num_rows, pa.int64()))
    return pa.concat_tables([winners, keyless.cast(winners.schema)])
