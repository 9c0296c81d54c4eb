"""Fan-out and routing on the real broker and Spark: each table goes its own way, exactly once.

* a sink added to an existing fan-out reads from its own ``starting_offsets`` while the others go on
  from their offsets, in one read;
* a sink whose table refuses a batch (a CHECK constraint added with deltalake's ``alter``, no dead
  letters) stays behind while the others commit, and catches up once the constraint is dropped;
* ``{topic}`` in ``table_uri`` with a ``topic_pattern``: one table per matching topic, a topic created
  between runs gets its table on the next run, internal topics never match.

Tables are read with DuckDB's delta extension and compared with their models (tests/fanout.py).
The Kill tests of a fan-out are in tests/system/faults/test_fanout_faults.py.
"""

from __future__ import annotations

import os
import re
import uuid

import pytest
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from airflow_eo.attempt import Secrets
from airflow_eo.core.errors import AirflowEoError
from airflow_eo.loop.ingest import FanOut
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.spec.fanout import FanOutSpec
from airflow_eo.testing.kafka import TestBroker
from tests.delta_tables import log_digest
from tests.fanout import RAW_SQL, MixedEvents, Table, assert_table, assert_tables, sinks, tables
from tests.helpers import new_topic

INGEST_ID = "fan"


@pytest.fixture
def test_broker(kafka_config) -> TestBroker:
    return TestBroker.connect(kafka_config["bootstrap.servers"])


def fan_out(spark_path, kafka_config, **options) -> FanOut:
    """A fan-out of ``options`` (the operator's argument names) run on ``spark_path``; Spark tasks read."""
    spec = FanOutSpec.of(ingest_id=INGEST_ID, driver_read_max_offsets=0, **options)
    return FanOut(spec, Secrets(kafka_config), spark_path.submitter())


def statuses(result) -> dict[str, str]:
    """Each table's status by its directory's name."""
    return {os.path.basename(t.table_uri): str(t.status) for t in result.tables}


@pytest.mark.parametrize("spark_path", ["local"], indirect=True)
def test_a_sink_added_later_reads_from_its_own_start_in_the_same_read(spark_path, kafka_config, test_broker, tmp_path):
    topic = new_topic(kafka_config, 3)
    events = MixedEvents(test_broker, topic)
    raw, type_a, type_b = tables(str(tmp_path), ("raw", "type_a", "type_b"))
    events.send(range(24), types="abc")
    first = test_broker.end_offsets(topic)
    result = fan_out(spark_path, kafka_config, topics=[topic], sinks=sinks([raw, type_a])).run(RunIdentity("r1"))
    assert statuses(result) == {"raw": "committed", "type_a": "committed"}
    assert_tables([raw, type_a], test_broker, topic, ingest_id=INGEST_ID, ends=first)

    events.send(range(12), types="ab")
    ends = test_broker.end_offsets(topic)
    start = {p: end // 2 for p, end in first.items()}  # inside the first batch: neither the beginning nor the others' offsets
    added = {**type_b.sink, "starting_offsets": {topic: {str(p): o for p, o in start.items()}}}
    result = fan_out(spark_path, kafka_config, topics=[topic], sinks=[*sinks([raw, type_a]), added]).run(RunIdentity("r2"))
    assert statuses(result) == {"raw": "committed", "type_a": "committed", "type_b": "committed"}
    assert_tables([raw, type_a], test_broker, topic, ingest_id=INGEST_ID, ends=ends)
    got_b = assert_table(type_b, test_broker, topic, ingest_id=INGEST_ID, ends=ends, starts=start)
    by_table = {os.path.basename(t.table_uri): t for t in result.tables}
    assert by_table["raw"].rows == sum(ends.values()) - sum(first.values())  # only the new records
    assert by_table["type_b"].rows == got_b > 0  # from its own start, across both batches' records
    assert {(r["partition"], r["start"], r["end"]) for r in by_table["type_b"].ranges} == \
        {(p, start[p], end) for p, end in ends.items() if end > start[p]}, by_table["type_b"].ranges
    assert by_table["type_b"].batch == 1 and by_table["raw"].batch == 2


@pytest.mark.parametrize("spark_path", ["local"], indirect=True)
def test_a_table_that_refuses_a_batch_stays_behind_then_catches_up(spark_path, kafka_config, test_broker, tmp_path):
    topic = new_topic(kafka_config, 3)
    events = MixedEvents(test_broker, topic)
    ts = raw, type_a, type_b = tables(str(tmp_path), ("raw", "type_a", "type_b"))
    loop = fan_out(spark_path, kafka_config, topics=[topic], sinks=sinks(ts))
    events.send(range(24), types="abc")
    first = test_broker.end_offsets(topic)
    assert loop.run(RunIdentity("r1")).status == RunStatus.COMMITTED
    assert_tables(ts, test_broker, topic, ingest_id=INGEST_ID, ends=first)

    # another engine adds a rule to one table that the next batch breaks (no dead-letter table)
    DeltaTable(type_b.uri).alter.add_constraint({"no_refusals": "value NOT LIKE '%refuse%'"})
    events.send(range(9), types="ab", extra={"note": "refuse"})
    ends = test_broker.end_offsets(topic)
    before = log_digest(type_b.uri)
    with pytest.raises(AirflowEoError, match=re.escape(type_b.uri)) as refused:
        loop.run(RunIdentity("r2"))
    assert len(str(refused.value).splitlines()) == 1, str(refused.value)
    assert_tables([raw, type_a], test_broker, topic, ingest_id=INGEST_ID, ends=ends)  # the others went on
    assert log_digest(type_b.uri) == before  # not a commit more
    assert_table(type_b, test_broker, topic, ingest_id=INGEST_ID, ends=first)

    DeltaTable(type_b.uri).alter.drop_constraint("no_refusals")
    retry = loop.run(RunIdentity("r2"))  # Airflow's retry of the failed run
    assert retry.status == RunStatus.COMMITTED
    assert statuses(retry) == {"raw": "already_committed", "type_a": "already_committed", "type_b": "committed"}
    assert_tables(ts, test_broker, topic, ingest_id=INGEST_ID, ends=ends)
    assert statuses(loop.run(RunIdentity("r3"))) == {"raw": "nothing_new", "type_a": "nothing_new",
                                                     "type_b": "nothing_new"}


@pytest.mark.parametrize("spark_path", ["connect"], indirect=True)
def test_routing_by_topic_gives_a_topic_created_between_runs_its_table(spark_path, kafka_config, test_broker, tmp_path):
    prefix = f"route-{uuid.uuid4().hex[:8]}"
    x, y = (new_topic(kafka_config, 2, name=f"{prefix}-{n}") for n in ("x", "y"))
    elsewhere = new_topic(kafka_config, 1, name=f"not-{prefix}-z")  # contains a match, is none: the pattern is a full match
    for topic in (x, y, elsewhere):
        test_broker.produce(topic, [{"type": "a", "id": i, "n": i} for i in range(7)])
    root = str(tmp_path / "by-topic")
    options = {"topic_pattern": re.escape(prefix) + r"-\w+", "table_uri": os.path.join(root, "{topic}"),
               "transform_sql": RAW_SQL}

    def table(topic: str) -> Table:
        return Table("raw", os.path.join(root, topic))

    loop = fan_out(spark_path, kafka_config, **options)
    assert statuses(loop.run(RunIdentity("r1"))) == {x: "committed", y: "committed"}
    assert sorted(os.listdir(root)) == [x, y]
    for topic in (x, y):
        assert assert_table(table(topic), test_broker, topic, ingest_id=INGEST_ID, ends=test_broker.end_offsets(topic)) == 7

    z = new_topic(kafka_config, 3, name=f"{prefix}-z")  # created between runs
    test_broker.produce(z, [{"type": "b", "id": i, "n": i} for i in range(5)])
    test_broker.produce(x, [{"type": "c", "id": i, "n": i} for i in range(3)])
    result = fan_out(spark_path, kafka_config, **options).run(RunIdentity("r2"))
    assert statuses(result) == {x: "committed", y: "nothing_new", z: "committed"}
    assert sorted(os.listdir(root)) == [x, y, z]
    rows = {t: assert_table(table(t), test_broker, t, ingest_id=INGEST_ID, ends=test_broker.end_offsets(t))
            for t in (x, y, z)}
    assert rows == {x: 10, y: 7, z: 5}


def test_a_pattern_never_matches_internal_topics(kafka_config, test_broker, tmp_path):
    prefix = f"route-{uuid.uuid4().hex[:8]}"
    mine = new_topic(kafka_config, 1, name=f"{prefix}-a")
    test_broker.produce_transaction(mine, [b"x"])  # the broker then holds __transaction_state
    listed = AdminClient(dict(kafka_config)).list_topics(timeout=10).topics
    internal = sorted(t for t in listed if t.startswith("__"))
    assert "__transaction_state" in internal, sorted(listed)  # else the check below could not fail
    spec = FanOutSpec.of(ingest_id=INGEST_ID, topic_pattern=rf"__.*|{re.escape(prefix)}-.*",
                         table_uri=str(tmp_path / "{topic}"))
    configs = FanOut(spec, Secrets(kafka_config), submitter=None).configs()
    assert sorted(topic for c in configs for topic in c.topics) == [mine], internal
