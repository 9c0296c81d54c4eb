"""The exactly-once protocol end to end on real parts: broker, Spark, Delta table.

Most tests run on both in-process paths (fixture ``spark_path``): the session's local
SparkSession, and the warm Spark Connect server (the ``--remote`` / ``spark_connect`` path,
reading and writing on the server, committing here) — and a third time with the spec's default
``driver_read_max_offsets``, where these small batches are read and staged by the driver itself.
The tests about process crashes go through real spark-submit, because a crash is a process dying.
"""

import threading
import uuid

import pytest
from confluent_kafka import TopicPartition as KTP
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from airflow_eo.core.errors import CommitConflictError, DataLossError, SparkJobError
from airflow_eo.table.ledger import Ledger
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.table.staging import StagingArea
from airflow_eo.table.storage import TableLocation
from airflow_eo.attempt import Secrets
from airflow_eo.driver.main import run_recorded_attempt
from airflow_eo.submit.spark_submit import LocalSparkSubmit
from airflow_eo.spec import Transform
from tests.conftest import build_config, open_spark_path
from tests.helpers import (
    assert_exactly_once,
    add_partitions, broker_records, committed_offsets, new_topic, produce,
    read_table, transactional_producer,
)


@pytest.fixture(params=["local", "connect", "driver"])
def spark_path(request, spark):
    """The exactly-once core on both Spark paths and, with the spec's default
    driver_read_max_offsets, in the driver itself (these batches are small)."""
    path = open_spark_path(request, spark)
    yield path
    path.close()


class NoSpark:
    """A submitter for runs that must not start Spark: fails the test if asked to."""

    def submit(self, attempt, secrets):
        raise AssertionError("Spark was started for a run that needed none")


def run(ing, key=None):
    return ing.run(RunIdentity(key or uuid.uuid4().hex))


def test_several_topics_several_runs_exactly_once(broker, kafka_config, spark_path, table_uri, ingestion):
    t1, t2 = new_topic(kafka_config, 3), new_topic(kafka_config, 2)
    produce(kafka_config, t1, 900, partitions=3)
    produce(kafka_config, t2, 400, partitions=2)
    ing = ingestion(table_uri, [t1, t2], kafka_config, spark_path.submitter(), max_records_per_run=500)
    statuses = [run(ing).status for _ in range(4)]
    assert statuses == ["committed", "committed", "committed", "nothing_new"]
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [t1, t2]) == 1300
    assert committed_offsets(table_uri, "test", t1, 3) == {0: 300, 1: 300, 2: 300}
    assert committed_offsets(table_uri, "test", t2, 2) == {0: 200, 1: 200}
    history = Ledger.open(table_uri).batches("test")
    assert [b.meta.batch for b in history] == [3, 2, 1]
    assert sum(b.meta.rows for b in history) == 1300


def test_new_records_between_runs_and_nothing_new_commits_nothing(broker, kafka_config, spark_path, table_uri, ingestion):
    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 100, partitions=2)
    ing = ingestion(table_uri, [topic], kafka_config, spark_path.submitter())
    assert run(ing).rows == 100
    version = DeltaTable(table_uri).version()
    nothing = run(ing)
    assert nothing.status == "nothing_new" and not nothing.spark_started
    assert DeltaTable(table_uri).version() == version
    produce(kafka_config, topic, 50, partitions=2, start=100)
    assert run(ing).rows == 50
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 150


def test_crash_after_staging_before_commit(broker, kafka_config, table_uri, ingestion):
    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 200, partitions=2)
    crashing = ingestion(table_uri, [topic], kafka_config,
                         LocalSparkSubmit("local[2]", extra_env={"AIRFLOW_EO_FAILPOINTS": "after_stage"}))
    with pytest.raises(SparkJobError, match="without committing"):
        run(crashing, "run-1")
    assert not DeltaTable.is_deltatable(table_uri), "nothing may be visible after a crash before commit"
    staged = [d.base_name for d in TableLocation.of(table_uri).list_dirs(table_uri) if d.base_name.startswith("b")]
    assert len(staged) == 1, "the crashed attempt staged files"
    result = run(ingestion(table_uri, [topic], kafka_config, LocalSparkSubmit("local[2]")), "run-1")
    assert result.status == "committed" and result.rows == 200
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 200
    left = {d.base_name for d in TableLocation.of(table_uri).list_dirs(table_uri)}
    assert staged[0] not in left, "orphaned files of the crashed attempt were collected"


def test_crash_after_commit_before_caller_learns(broker, kafka_config, table_uri, ingestion):
    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 120, partitions=2)
    crashing = ingestion(table_uri, [topic], kafka_config,
                         LocalSparkSubmit("local[2]", extra_env={"AIRFLOW_EO_FAILPOINTS": "after_commit"}))
    result = run(crashing, "run-x")
    assert result.status == "committed" and result.batch == 1, "the loop finds the commit in the log"
    version = DeltaTable(table_uri).version()
    again = run(ingestion(table_uri, [topic], kafka_config, NoSpark()), "run-x")
    assert again.status == "already_committed" and again.batch == 1 and again.version == version
    assert DeltaTable(table_uri).version() == version
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 120


def test_replayed_attempt_commits_nothing_twice(broker, kafka_config, spark_path, table_uri, ingestion):
    """The same attempt executed twice (a duplicated Spark job): the second commits nothing."""
    topic = new_topic(kafka_config, 1)
    produce(kafka_config, topic, 30, partitions=1)
    ing = ingestion(table_uri, [topic], kafka_config, spark_path.submitter())
    plan = ing.plan(RunIdentity("dup"))
    ing.plans.record(plan)
    attempt = plan.with_attempt("a" * 16)
    ing.staging.begin_attempt(ing.config.attempt(attempt))
    session = spark_path.session()
    first = run_recorded_attempt(session, table_uri, attempt.attempt_id, Secrets(kafka_config))
    second = run_recorded_attempt(session, table_uri, attempt.attempt_id.replace("a", "b"), Secrets(kafka_config)) \
        if ing.staging.begin_attempt(ing.config.attempt(plan.with_attempt("b" * 16))) else None
    assert (first.status, second.status) == ("committed", "already_committed")
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 30


def test_racing_commits_of_same_range(broker, kafka_config, spark_path, table_uri, ingestion):
    """Two attempts of one plan commit at once: one lands, the other commits nothing."""
    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 60, partitions=2)
    ing = ingestion(table_uri, [topic], kafka_config, spark_path.submitter())
    run(ing)  # the table exists: racing appends, not racing creates
    produce(kafka_config, topic, 60, partitions=2, start=60)
    plan = ing.plan(RunIdentity("race"))
    ids = ["c" * 16, "d" * 16]
    for attempt_id in ids:
        ing.staging.begin_attempt(ing.config.attempt(plan.with_attempt(attempt_id)))
    barrier, outcomes = threading.Barrier(2), {}
    sessions = {i: spark_path.session() for i in ids}  # on Connect: two clients racing through one server

    def go(attempt_id):
        session = sessions[attempt_id]
        barrier.wait()
        try:
            outcomes[attempt_id] = run_recorded_attempt(session, table_uri, attempt_id, Secrets(kafka_config)).status
        except CommitConflictError as exc:
            outcomes[attempt_id] = f"conflict: {exc}"

    threads = [threading.Thread(target=go, args=(i,)) for i in ids]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(outcomes) == ids, outcomes  # both attempts ended (a thread that crashed has no outcome)
    kinds = sorted(o.split(":")[0] for o in outcomes.values())
    assert kinds in (["already_committed", "committed"], ["committed", "conflict"]), outcomes
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 120


def test_stale_plan_conflicts_instead_of_duplicating(broker, kafka_config, spark_path, table_uri, ingestion):
    """A plan made before another run committed fails its compare-and-set."""
    topic = new_topic(kafka_config, 1)
    produce(kafka_config, topic, 40, partitions=1)
    ing = ingestion(table_uri, [topic], kafka_config, spark_path.submitter(), max_records_per_run=10)
    run(ing)
    stale = ing.plan(RunIdentity("slow"))
    bigger = ingestion(table_uri, [topic], kafka_config, spark_path.submitter(), max_records_per_run=15)
    run(bigger)  # another run commits a different range from the same start first
    ing.staging.begin_attempt(ing.config.attempt(stale.with_attempt("e" * 16)))
    session = spark_path.session()
    with pytest.raises(CommitConflictError, match="another run committed in between"):
        run_recorded_attempt(session, table_uri, "e" * 16, Secrets(kafka_config))
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 25


def test_transactions_only_committed_records_land_open_waits(broker, kafka_config, spark_path, table_uri, ingestion):
    topic = new_topic(kafka_config, 1)
    tx = transactional_producer(kafka_config)
    tx.begin_transaction()
    for i in range(5):
        tx.produce(topic, value=b"committed%d" % i, partition=0)
    tx.commit_transaction()
    tx.begin_transaction()
    for i in range(5):
        tx.produce(topic, value=b"aborted%d" % i, partition=0)
    tx.flush()  # on the broker before the abort (abort_transaction drops what is still queued)
    tx.abort_transaction()
    uncommitted = broker_records(broker.bootstrap_servers, topic, read_committed=False).values()
    assert sum(v.startswith(b"aborted") for v in uncommitted) == 5, "the aborted records must be on the broker"
    tx2 = transactional_producer(kafka_config)
    tx2.begin_transaction()
    tx2.produce(topic, value=b"open0", partition=0)
    tx2.flush()
    produce(kafka_config, topic, 3, partitions=1, prefix="plain")
    ing = ingestion(table_uri, [topic], kafka_config, spark_path.submitter())
    run(ing)
    values = set(read_table(table_uri, ["value"])["value"].to_pylist())
    assert values == {b"committed%d" % i for i in range(5)}, "aborted and open records must not land"
    tx2.commit_transaction()
    run(ing)
    values = read_table(table_uri, ["value"])["value"].to_pylist()
    assert sorted(values) == sorted([b"committed%d" % i for i in range(5)] + [b"open0"] + [b"plain%d" % i for i in range(3)])
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 9


def test_retention_loss_fails_then_skip_records_gap(broker, kafka_config, spark_path, table_uri, ingestion):
    topic = new_topic(kafka_config, 1)
    produce(kafka_config, topic, 10, partitions=1)
    ing = ingestion(table_uri, [topic], kafka_config, spark_path.submitter())
    run(ing)
    produce(kafka_config, topic, 10, partitions=1, start=10)
    admin = AdminClient(kafka_config)  # keep the client alive until the futures resolve
    for f in admin.delete_records([KTP(topic, 0, 15)]).values():
        f.result()
    version = DeltaTable(table_uri).version()
    with pytest.raises(DataLossError, match=rf"{topic}\[0\].*next offset is 10.*starts at 15"):
        run(ing)
    assert DeltaTable(table_uri).version() == version
    skipping = ingestion(table_uri, [topic], kafka_config, spark_path.submitter(), on_data_loss="skip")
    result = run(skipping)
    assert result.rows == 5
    latest = Ledger.open(table_uri).batches("test", limit=1)[0]
    assert [(s.start, s.end) for s in latest.meta.skipped] == [(10, 15)]


def test_new_partition_picked_up_from_starting_position(broker, kafka_config, spark_path, table_uri, ingestion):
    topic = new_topic(kafka_config, 1)
    produce(kafka_config, topic, 10, partitions=1)
    ing = ingestion(table_uri, [topic], kafka_config, spark_path.submitter())
    run(ing)
    add_partitions(kafka_config, topic, 2)
    produce(kafka_config, topic, 10, partitions=2, start=10)
    result = run(ing)
    assert {(r["partition"], r["start"], r["end"]) for r in result.ranges} == {(0, 10, 15), (1, 0, 5)}
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 20


def test_latest_start_of_an_empty_new_partition_is_committed(broker, kafka_config, spark_path, table_uri, ingestion):
    """'latest' is resolved once: records produced after the first run are not skipped."""
    topic = new_topic(kafka_config, 1)
    produce(kafka_config, topic, 10, partitions=1)
    ing = ingestion(table_uri, [topic], kafka_config, spark_path.submitter(), starting_offsets="latest")
    first = run(ing)
    assert first.status == "committed" and first.rows == 0
    produce(kafka_config, topic, 4, partitions=1, start=10)
    assert run(ing).rows == 4


def test_cap_is_honoured_and_fair(broker, kafka_config, spark_path, table_uri, ingestion):
    topic = new_topic(kafka_config, 3)
    producer_counts = {0: 10, 1: 300, 2: 300}
    from confluent_kafka import Producer

    p = Producer({**kafka_config, "enable.idempotence": True})
    for part, n in producer_counts.items():
        for _ in range(n):
            p.produce(topic, value=b"x", partition=part)
    p.flush()
    ing = ingestion(table_uri, [topic], kafka_config, spark_path.submitter(), max_records_per_run=100)
    result = run(ing)
    assert result.rows == 100
    assert result.rows_per_partition == {f"{topic}[0]": 10, f"{topic}[1]": 45, f"{topic}[2]": 45}


def test_sql_transform_keeps_key_columns(broker, kafka_config, spark_path, table_uri, ingestion):
    topic = new_topic(kafka_config, 1)
    produce(kafka_config, topic, 5, partitions=1)
    ing = ingestion(table_uri, [topic], kafka_config, spark_path.submitter(), transform=Transform(
        sql="SELECT topic, partition, offset, timestamp, CAST(value AS STRING) AS body FROM source"))
    run(ing)
    table = read_table(table_uri)
    assert table.column_names == ["topic", "partition", "offset", "timestamp", "body"]
    assert sorted(table["body"].to_pylist()) == [f"v{i}" for i in range(5)]
    assert str(table.schema.field("timestamp").type) == "timestamp[us, tz=UTC]"


def test_orphans_of_running_attempts_are_never_collected(table_uri):
    """A staged directory whose attempt has not ended is kept, however the table looks."""
    from airflow_eo.core.planning import BatchPlan
    from airflow_eo.core.offsets import OffsetRange

    loc = TableLocation.of(table_uri)
    staging = StagingArea(loc)
    plan = BatchPlan("test", 1, (OffsetRange("t", 0, 0, 5),), RunIdentity("r"), attempt_id="f" * 16)
    path = staging.begin_attempt(build_config(table_uri, "t", {}).attempt(plan))
    loc.write_text(path + "/part-0.parquet", "x")
    assert staging.collect_orphans(set()) == []
    staging.end_attempt(plan.attempt_id)
    assert staging.collect_orphans(set()) == [path.rsplit("/", 1)[1]]


def test_an_orphan_that_cannot_be_removed_yet_is_left_for_the_next_run(table_uri):
    """A dead driver's tasks may still write into its directory (a Connect server finishes
    them), so deleting it can fail; that must not fail the run that collects, and the next
    pass removes it."""
    import dataclasses

    from airflow_eo.core.planning import BatchPlan
    from airflow_eo.core.offsets import OffsetRange

    class StillBeingWritten:  # the local filesystem, whose delete_dir loses a race with a writer
        def __init__(self, fs):
            self.fs = fs

        def __getattr__(self, name):
            return getattr(self.fs, name)

        def delete_dir(self, path):
            raise OSError(39, f"Cannot delete directory '{path}': Directory not empty")

    loc = TableLocation.of(table_uri)
    staging = StagingArea(loc)
    plan = BatchPlan("test", 1, (OffsetRange("t", 0, 0, 5),), RunIdentity("r"), attempt_id="e" * 16)
    path = staging.begin_attempt(build_config(table_uri, "t", {}).attempt(plan))
    loc.write_text(path + "/part-0.parquet", "x")
    staging.end_attempt(plan.attempt_id)
    racing = StagingArea(dataclasses.replace(loc, fs=StillBeingWritten(loc.fs)))
    assert racing.collect_orphans(set()) == []
    assert loc.fs.get_file_info(path).type.name == "Directory"  # untouched, marker too
    assert staging.collect_orphans(set()) == [path.rsplit("/", 1)[1]]
    assert loc.fs.get_file_info(path).type.name == "NotFound"
