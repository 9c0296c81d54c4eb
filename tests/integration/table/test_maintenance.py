"""Table maintenance (airflow_eo.table.maintenance) on tables written by real ingests:
the offsets, every record and the staged files of running attempts survive it."""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid

import pytest
from deltalake import DeltaTable

from airflow_eo.core.errors import ConfigError
from airflow_eo.loop.ingest import Ingestion
from airflow_eo.core.offsets import TopicPartition, OffsetRange, RunIdentity
from airflow_eo.core.planning import BatchPlan
from airflow_eo.status import table_status
from airflow_eo.table.metadata import BatchMetadata, CommitKind, METADATA_KEY
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.app_ids import batch_app_id, partition_app_id
from airflow_eo.table.maintenance import MaintenancePlan, layout, maintain
from airflow_eo.table.staging import StagingArea
from airflow_eo.table.storage import TableLocation
from tests.conftest import SparkPath, build_config, build_ingestion
from tests.helpers import assert_exactly_once, committed_offsets, new_topic, produce

NOTHING = MaintenancePlan(compact=False, vacuum=False, checkpoint=False, cleanup_log=False, prune_orphans=False,
                          prune_records=False)


def small_batches(spark_path, kafka_config, table_uri, topic, batches: int, per_batch: int = 6) -> Ingestion:
    # the identity transform: values comparable to Kafka's
    ing = build_ingestion(table_uri, topic, kafka_config, spark_path.submitter(), max_records_per_run=per_batch)
    for _ in range(batches):
        assert ing.run(RunIdentity(uuid.uuid4().hex)).status == "committed"
    return ing


def test_300_small_batches_compact_keeping_every_record_and_the_offsets_and_ingestion_continues(broker, kafka_config, spark, table_uri):
    topic = new_topic(kafka_config, 3)
    produce(kafka_config, topic, 600, partitions=3)
    # the spec's default path for small batches: the driver reads and stages them (a file per batch)
    ing = small_batches(SparkPath("driver", spark), kafka_config, table_uri, topic, 300, per_batch=2)
    before = layout(Ledger.open(table_uri))
    offsets = committed_offsets(table_uri, "test", topic, 3)
    assert before.files >= 300 and before.due[0].startswith("compaction:")  # a file per batch

    done = maintain(table_uri, plan=MaintenancePlan(vacuum=False))
    after = layout(Ledger.open(table_uri))
    assert after.files == 1 == done["compaction"]["numFilesAdded"]  # 600 small rows bin-pack into one file
    assert done["compaction"]["numFilesRemoved"] == before.files
    assert committed_offsets(table_uri, "test", topic, 3) == offsets
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 600
    assert after.versions_since_checkpoint == 0 and done["checkpoint_version"] == after.version

    produce(kafka_config, topic, 30, partitions=3, start=600)
    assert ing.run(RunIdentity("after-compaction")).status == "committed"  # continues from the offsets
    while ing.run(RunIdentity(uuid.uuid4().hex)).status == "committed":  # 2 per batch
        pass
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 630


def test_vacuum_deletes_removed_files_but_never_a_running_attempts_staged_files(broker, kafka_config, spark,
                                                                                  table_uri):
    topic = new_topic(kafka_config, 1)
    produce(kafka_config, topic, 12, partitions=1)
    small_batches(SparkPath("local", spark), kafka_config, table_uri, topic, 2)
    staging = StagingArea(TableLocation.of(table_uri))
    plan = BatchPlan("test", 3, (OffsetRange(topic, 0, 12, 18),), RunIdentity("running"), attempt_id="a" * 16)
    running = staging.begin_attempt(build_config(table_uri, "t", {}).attempt(plan))
    staging.driver_started(plan.attempt_id)  # this process: alive, so the attempt is running
    staging.loc.write_text(running + "/part-00000.parquet", "staged rows")
    old = os.path.getmtime(running + "/part-00000.parquet") - 30 * 24 * 3600
    os.utime(running + "/part-00000.parquet", (old, old))  # older than any retention
    compacted_away = set(Ledger.open(table_uri).file_paths())

    done = maintain(table_uri, plan=MaintenancePlan(retain_hours=0))
    assert done["vacuum"]["files_deleted"] == len(compacted_away) == 2
    assert not any(os.path.exists(os.path.join(table_uri, p)) for p in compacted_away)
    assert os.path.exists(running + "/part-00000.parquet") and done["orphans_removed"] == []
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 12

    staging.end_attempt(plan.attempt_id)  # it ended without committing: now an orphan
    pruned = maintain(table_uri, plan=dataclasses.replace(NOTHING, prune_orphans=True))
    assert pruned["orphans_removed"] == [os.path.basename(running)]
    assert not os.path.exists(running)


def test_a_table_whose_txn_actions_expire_is_refused_by_ingest_and_maintenance(kafka_config, spark, table_uri):
    topic = new_topic(kafka_config, 1)
    produce(kafka_config, topic, 6, partitions=1)
    ing = small_batches(SparkPath("local", spark), kafka_config, table_uri, topic, 1)
    version = DeltaTable(table_uri).version()
    DeltaTable(table_uri).alter.set_table_properties({"delta.setTransactionRetentionDuration": "interval 1 days"})
    produce(kafka_config, topic, 6, partitions=1, start=6)
    with pytest.raises(ConfigError, match="setTransactionRetentionDuration.*UNSET TBLPROPERTIES"):
        ing.run(RunIdentity("refused"))
    with pytest.raises(ConfigError, match="setTransactionRetentionDuration"):
        maintain(table_uri)
    assert DeltaTable(table_uri).version() == version + 1  # only the property change; nothing of ours
    assert "setTransactionRetentionDuration" in table_status(table_uri, "test", None).due[0]


def test_compaction_racing_ingests_under_live_produce_loses_and_doubles_nothing(broker, kafka_config, spark,
                                                                                table_uri):
    """Compactions commit while batches commit: each batch lands (a lost race is a retryable
    conflict, retried here as Airflow would) and every record is in the table once."""
    import threading
    import time

    from airflow_eo.core.errors import CommitConflictError

    topic = new_topic(kafka_config, 3)
    produce(kafka_config, topic, 60, partitions=3)
    ing = small_batches(SparkPath("local", spark), kafka_config, table_uri, topic, 1, per_batch=30)
    stop, produced, compactions, conflicts = threading.Event(), [60], [], []

    def keep_producing():
        while not stop.is_set():
            produce(kafka_config, topic, 15, partitions=3, start=produced[-1])
            produced.append(produced[-1] + 15)
            time.sleep(0.2)

    def keep_compacting():
        while not stop.is_set():
            try:
                # not waiting for the table's lease (as an earlier version would not): it races the batches
                compactions.append(maintain(table_uri, plan=MaintenancePlan(retain_hours=0, checkpoint=False,
                                                                            cleanup_log=False, table_wait_timeout=0)))
            except CommitConflictError as exc:
                conflicts.append(str(exc))

    threads = [threading.Thread(target=f, daemon=True) for f in (keep_producing, keep_compacting)]
    [t.start() for t in threads]
    try:
        for i in range(5):
            for _retry in range(5):  # Airflow's retries
                try:
                    assert ing.run(RunIdentity(f"race-{i}")).status in ("committed", "already_committed",
                                                                         "nothing_new")
                    break
                except CommitConflictError as exc:
                    conflicts.append(str(exc))
            else:
                raise AssertionError(f"batch {i} did not land in 5 tries: {conflicts[-1]}")
    finally:
        stop.set()
        [t.join(60) for t in threads]
    assert compactions, "no compaction ran beside the ingests"
    catch_up = small_batches(SparkPath("local", spark), kafka_config, table_uri, topic, 0, per_batch=10 ** 6)
    assert catch_up.run(RunIdentity("catch-up")).status == "committed"  # the rest of what was produced
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == produced[-1]


def test_old_records_that_nothing_needs_are_pruned_and_the_rest_kept(broker, kafka_config, spark, table_uri):
    from airflow_eo.table.audit_log import AUDITS_DIR, AuditLog
    from airflow_eo.table.plan_log import PLANS_DIR, PlanLog
    from airflow_eo.table.staging import ATTEMPTS_DIR

    topic = new_topic(kafka_config, 1)
    produce(kafka_config, topic, 12, partitions=1)
    ing = small_batches(SparkPath("local", spark), kafka_config, table_uri, topic, 2)  # batches 1 and 2
    location = TableLocation.of(table_uri)
    pending = BatchPlan("test", 3, (OffsetRange(topic, 0, 12, 18),), RunIdentity("pending"))
    PlanLog(location).record(pending)  # logged, not committed: a retry may still replay it
    running = BatchPlan("test", 3, (OffsetRange(topic, 0, 12, 18),), RunIdentity("pending"), attempt_id="c" * 16)
    ing.staging.begin_attempt(build_config(table_uri, "t", {}).attempt(running))  # its directory does not exist yet
    audits = AuditLog(location)  # two old audits: the newest is where the next one starts, so it stays
    for day in ("01", "02"):
        at = f"2026-01-{day}T00:00:00.000000Z"
        audits.record("test", at, json.dumps({"ingest_id": "test", "audited_at": at, "through_version": int(day),
                                               "drift": False}))
    records = [i.path for d in (PLANS_DIR, ATTEMPTS_DIR, AUDITS_DIR) for i in location.list_files(location.join(d))]
    month_ago = os.path.getmtime(records[0]) - 31 * 86400
    for path in records:
        os.utime(path, (month_ago, month_ago))

    removed = maintain(table_uri, plan=dataclasses.replace(NOTHING, prune_records=True))["records_removed"]
    assert removed == {"plans": 2, "reprocess_requests": 0, "attempt_markers": 0, "audits": 1}  # their files are the table's
    assert audits.last("test").through_version == 2
    for path in records:
        if os.path.exists(path):
            os.utime(path, (month_ago, month_ago))
    removed = maintain(table_uri, plan=MaintenancePlan(retain_hours=0))["records_removed"]  # files compacted away
    assert removed == {"plans": 0, "reprocess_requests": 0, "attempt_markers": 2, "audits": 0}  # batches 1 and 2
    assert PlanLog(location).load("pending") == pending
    assert ing.staging.read_marker(running.attempt_id) is not None  # not ended: kept
    produce(kafka_config, topic, 6, partitions=1, start=12)
    assert ing.run(RunIdentity("pending")).status == "committed"  # the logged plan replays
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 18


def test_maintenance_while_an_attempt_is_staged_keeps_its_files_and_it_commits(broker, kafka_config, spark, table_uri,
                                                                              monkeypatch):
    """The attempt is held open between staging and its commit (its ``after_stage`` fault point
    waits instead of killing); every maintenance action with ``--retain-hours 0`` runs then."""
    import threading

    from airflow_eo.driver import batch as driver_batch

    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 40, partitions=2)
    ing = small_batches(SparkPath("local", spark), kafka_config, table_uri, topic, 3, per_batch=10)
    staged, release = threading.Event(), threading.Event()

    def hold(name):
        if name == "after_stage":
            staged.set()
            assert release.wait(120), "the test never released the attempt"

    monkeypatch.setattr(driver_batch, "failpoint", hold)
    outcome = {}
    runner = threading.Thread(target=lambda: outcome.update(result=ing.run(RunIdentity("held"))))
    runner.start()
    try:
        assert staged.wait(120), "the attempt never staged"
        running = [d for d in os.listdir(table_uri) if d.startswith("b00000004-")]
        files = [os.path.join(table_uri, running[0], f) for f in os.listdir(os.path.join(table_uri, running[0]))]
        for path in files:  # older than any retention
            os.utime(path, (1_000_000_000, 1_000_000_000))
        # maintenance queues behind the running batch (the table's lease); one that stops waiting at once
        # (table_wait_timeout=0, or an earlier version that takes no lease) runs beside it, safely
        assert ing.lease().holder().run_key == "held"
        done = maintain(table_uri, plan=MaintenancePlan(retain_hours=0, keep_days=0, table_wait_timeout=0))
        assert done["compaction"]["numFilesRemoved"] >= 3 and done["vacuum"]["files_deleted"] >= 3
        assert all(os.path.exists(p) for p in files)  # the staged files survived every action
    finally:
        release.set()
        runner.join(120)
    assert outcome["result"].status == "committed" and outcome["result"].batch == 4
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 40


def test_table_properties_are_set_when_the_first_batch_creates_the_table(kafka_config, spark, table_uri):
    topic = new_topic(kafka_config, 1)
    produce(kafka_config, topic, 4, partitions=1)
    properties = {"delta.checkpointInterval": "10", "delta.logRetentionDuration": "interval 60 days"}
    ing = build_ingestion(table_uri, topic, kafka_config, SparkPath("local", spark).submitter(),
                          table_properties=properties)
    assert ing.run(RunIdentity("first")).status == "committed"
    assert DeltaTable(table_uri).metadata().configuration == properties
    assert layout(Ledger.open(table_uri)).checkpoint_interval == 10

    with pytest.raises(ConfigError, match="setTransactionRetentionDuration would expire"):
        build_config(table_uri + "2", topic, kafka_config,
                     table_properties={"delta.setTransactionRetentionDuration": "interval 1 days"})
    # a number or a boolean is taken as its text; anything else is refused
    assert build_config(table_uri + "2", topic, kafka_config, table_properties={
        "delta.checkpointInterval": 10, "delta.appendOnly": False}).spec.table.table_properties == {
        "delta.checkpointInterval": "10", "delta.appendOnly": "false"}
    with pytest.raises(ConfigError, match="as text"):
        build_config(table_uri + "2", topic, kafka_config, table_properties={"delta.checkpointInterval": [10]})


def test_a_table_of_10k_commits_plans_from_one_checkpoint_after_maintain(broker, kafka_config, spark, table_uri):
    """10,000 commits (the writer checkpoints every 100 but never cleans its log): after
    ``maintain`` the log holds one checkpoint and no commit before it, so planning can only read
    the checkpoint plus the few commits after it — and finds the offsets there, and ingestion
    continues from them."""
    topic = new_topic(kafka_config, 1)
    produce(kafka_config, topic, 12, partitions=1)
    ing = build_ingestion(table_uri, topic, kafka_config, SparkPath("local", spark).submitter(),
                          table_properties={"delta.logRetentionDuration": "interval 0 seconds"})
    first = ing.run(RunIdentity("first"))
    assert first.status == "committed" and first.rows == 12
    # 10k commits carrying what an ingest's commit carries but no file: the partition's txn, the
    # batch's txn and the batch metadata, in the form deltalake writes them (its own writer took
    # ~4 minutes for this: each commit lists a log of up to 10k files), with deltalake's
    # checkpoint every 100 versions, as its writer makes them
    log_dir = os.path.join(table_uri, "_delta_log")
    version, tp = DeltaTable(table_uri).version(), TopicPartition(topic, 0)
    for batch in range(first.batch + 1, first.batch + 10_001):
        plan = BatchPlan("test", batch, (OffsetRange(topic, 0, 12, 12),), RunIdentity(f"r{batch}"),
                         attempt_id=f"{batch:016x}")
        version += 1
        with open(os.path.join(log_dir, f"{version:020d}.json"), "x") as f:
            f.write("\n".join(json.dumps(action) for action in (
                {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "WRITE",
                                "operationParameters": {"mode": "Append", "partitionBy": "[]"},
                                METADATA_KEY: BatchMetadata.of(CommitKind.BATCH, plan).to_json()}},
                {"txn": {"appId": partition_app_id("test", tp), "version": 12}},
                {"txn": {"appId": batch_app_id("test"), "version": batch}})) + "\n")
        if version % 100 == 0:
            DeltaTable(table_uri).create_checkpoint()
    assert len([f for f in os.listdir(log_dir) if f.endswith(".json")]) > 10_000
    assert len([f for f in os.listdir(log_dir) if f.endswith(".checkpoint.parquet")]) >= 100

    maintain(table_uri)
    names = os.listdir(log_dir)
    checkpoints = [n for n in names if n.endswith(".checkpoint.parquet")]
    commits = sorted(int(n.split(".")[0]) for n in names if n.endswith(".json"))
    assert len(checkpoints) == 1, checkpoints
    checkpoint_version = int(checkpoints[0].split(".")[0])
    assert commits and commits[0] >= checkpoint_version and len(commits) <= 3, commits  # nothing older is left
    ledger = Ledger.open(table_uri)
    assert ledger.committed_offsets("test", [tp]) == {tp: 12} and ledger.last_batch("test") == first.batch + 10_000

    produce(kafka_config, topic, 6, partitions=1, start=12)
    after = ing.run(RunIdentity("after-maintain"))
    assert after.status == "committed" and after.batch == first.batch + 10_001 and after.rows == 6
    assert [(r["start"], r["end"]) for r in after.ranges] == [(12, 18)]
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 18
