"""The order rule (airflow_eo.driver.changes): which record of a key wins, in Arrow, checked
against a plain-Python statement of the rule."""

import random

import pyarrow as pa

from airflow_eo.driver.changes import CHANGES_COLUMN, TS_COLUMN, select_winners


def batch(rows: list[tuple]) -> pa.Table:
    """rows of (id, topic, partition, offset, timestamp ms, body)."""
    names = ["id", "topic", "partition", "offset", TS_COLUMN, "body"]
    columns = list(zip(*rows)) if rows else [[]] * len(names)
    types = [pa.int64(), pa.string(), pa.int32(), pa.int64(), pa.int64(), pa.string()]
    return pa.table({n: pa.array(list(c), t) for n, c, t in zip(names, columns, types)})


def winners(rows: list[tuple]) -> dict:
    out = select_winners(batch(rows), ("id",))
    return {r["id"]: (r["partition"], r["offset"], r[CHANGES_COLUMN]) for r in out.to_pylist()}


def test_within_a_partition_the_highest_offset_wins_whatever_the_timestamps():
    rows = [(1, "t", 0, 5, 300, "a"), (1, "t", 0, 9, 100, "b"), (1, "t", 0, 7, 900, "c")]
    assert winners(rows) == {1: (0, 9, 3)}


def test_across_partitions_the_last_records_compare_by_timestamp_then_partition_then_offset():
    # partition 0's last record (offset 7, ts 90) loses to partition 1's (ts 95), although
    # partition 0 also holds an older record with a later timestamp (offset 5, ts 100)
    assert winners([(1, "t", 0, 5, 100, "a"), (1, "t", 0, 7, 90, "b"), (1, "t", 1, 3, 95, "c")]) == {1: (1, 3, 3)}
    assert winners([(2, "t", 0, 4, 50, "a"), (2, "t", 2, 1, 50, "b")]) == {2: (2, 1, 2)}  # tie: partition
    assert winners([(3, "t", 1, 9, 50, "a"), (3, "u", 1, 4, 50, "b")]) == {3: (1, 9, 2)}  # tie: offset


def test_keys_are_independent_and_null_keys_pass_through_one_by_one():
    rows = [(1, "t", 0, 1, 1, "a"), (2, "t", 0, 2, 1, "b"), (1, "t", 0, 3, 1, "c"),
            (None, "t", 1, 4, 1, "x"), (None, "t", 1, 5, 1, "y")]
    out = select_winners(batch(rows), ("id",))
    assert sorted((r["id"] or 0, r["offset"], r[CHANGES_COLUMN]) for r in out.to_pylist()) == \
        [(0, 4, 1), (0, 5, 1), (1, 3, 2), (2, 2, 1)]
    assert out.column_names == [*batch(rows).column_names, CHANGES_COLUMN]


def test_a_key_of_several_columns_and_an_empty_batch():
    table = pa.table({"id": [1, 1, 1], "tenant": ["a", "b", "a"], "topic": ["t"] * 3, "partition": [0, 0, 0],
                      "offset": [1, 2, 3], TS_COLUMN: [1, 1, 1]})
    out = select_winners(table, ("id", "tenant")).to_pylist()
    assert sorted((r["tenant"], r["offset"], r[CHANGES_COLUMN]) for r in out) == [("a", 3, 2), ("b", 2, 1)]
    assert select_winners(batch([]), ("id",)).num_rows == 0


def test_rows_with_list_and_map_columns_in_structs_keep_them():
    """Arrow's join takes no list or map column along: the winners carry them (a merge table's rows may)."""
    kind = pa.struct([("tags", pa.list_(pa.string())), ("attrs", pa.map_(pa.string(), pa.string()))])
    table = pa.table({"id": [1, 1, 2], "topic": ["t"] * 3, "partition": [0, 0, 0], "offset": [1, 2, 3],
                      TS_COLUMN: [1, 1, 1], "meta": pa.array([{"tags": ["a"], "attrs": [("k", "1")]},
                                                              {"tags": ["b"], "attrs": [("k", "2")]}, None], kind)})
    out = select_winners(table, ("id",)).sort_by("id").to_pylist()
    assert [(r["id"], r["meta"], r[CHANGES_COLUMN]) for r in out] == [
        (1, {"tags": ["b"], "attrs": [("k", "2")]}, 2), (2, None, 1)]


def reference(rows: list[tuple]) -> dict:
    """The rule as the docs state it, one key at a time."""
    by_key: dict = {}
    for r in rows:
        by_key.setdefault(r[0], []).append(r)
    out = {}
    for key, records in by_key.items():
        lasts = {}
        for r in records:  # each (topic, partition)'s highest offset
            tp = (r[1], r[2])
            if tp not in lasts or r[3] > lasts[tp][3]:
                lasts[tp] = r
        best = max(lasts.values(), key=lambda r: (r[4], r[2], r[3], r[1]))
        out[key] = (best[2], best[3], len(records))
    return out


def random_rows(rng: random.Random, keyless: float = 0.0) -> list[tuple]:
    """Up to 200 records of 20 keys over two topics of 3 partitions, offsets rising per partition
    (``keyless``: the share of records without a key)."""
    offsets = {(t, p): 0 for t in "tu" for p in range(3)}
    rows = []
    for _ in range(rng.randrange(1, 200)):
        tp = rng.choice(list(offsets))
        offsets[tp] += rng.randrange(1, 3)
        key = rng.randrange(20) if rng.random() >= keyless else None
        rows.append((key, tp[0], tp[1], offsets[tp], rng.randrange(5), "v"))
    return rows


def test_random_batches_agree_with_the_rule_as_stated():
    rng = random.Random(7)
    for _ in range(50):
        rows = random_rows(rng)
        assert winners(rows) == reference(rows)
