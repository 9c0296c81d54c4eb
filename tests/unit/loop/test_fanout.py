"""The fan-out loop without Spark or a broker: Kafka is a fake, the Spark job a submitter that commits
each table's batch (no rows, its offsets) through the real commit step, as the driver does."""

from __future__ import annotations

import os

import pytest

from airflow_eo.attempt import Attempt, Secrets
from airflow_eo.driver.batch import commit_staged
from airflow_eo.driver.reader import KAFKA_SCHEMA
from airflow_eo.core.errors import ConfigError, SparkUnavailableError, error_line
from airflow_eo.loop.ingest import FanOut, Ingestion
from airflow_eo.core.offsets import Interval, RunIdentity, TopicPartition
from airflow_eo.sinks import sink_of
from airflow_eo.spec.fanout import FanOutSpec
from airflow_eo.table.commit import StagedBatch
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.plan_log import PlanLog
from airflow_eo.table.staging import StagingArea
from airflow_eo.table.storage import TableLocation
from tests.unit.fakes import FakeKafka
from tests.conftest import build_config


class CommittingSubmitter:
    """Runs a fan-out attempt as the driver would, minus the read: each table's commit in turn; a
    table in ``refuse`` records its error in its own marker and the job fails after the others."""

    def __init__(self, refuse: tuple[str, ...] = ()):
        self.refuse, self.jobs = refuse, []

    def submit(self, first: Attempt, secrets: Secrets) -> None:
        attempts = [first] + [StagingArea(TableLocation.of(c.table_uri)).read_attempt(c.attempt_id)
                              for c in first.companions]
        self.jobs.append([a.table_uri for a in attempts])
        errors = []
        for attempt in attempts:
            staging = StagingArea(TableLocation.of(attempt.table_uri))
            if attempt.table_uri in self.refuse:
                error = ConfigError("a CHECK constraint refused the batch; nothing was committed")
                staging.record_error(attempt.attempt_id, error_line(error))
                errors.append(error)
                continue
            sink = sink_of(attempt.spec.sink)
            batch = StagedBatch(attempt.plan, (), {}, KAFKA_SCHEMA)
            commit_staged(attempt, staging, batch, sink.findings(attempt, None, None, None, ()), None, None, sink)
        if errors:
            raise errors[0]


def offsets(uri: str, topic: str, partitions: int = 2) -> list[int | None]:
    found = Ledger.open(uri).committed_offsets("fan", [TopicPartition(topic, p) for p in range(partitions)])
    return [found[TopicPartition(topic, p)] for p in range(partitions)]


@pytest.fixture
def kafka() -> FakeKafka:
    kafka = FakeKafka(events=2)
    for p in range(2):
        kafka.produce(TopicPartition("events", p), *range(10))
    return kafka


def fan_out(tmp_path, kafka, submitter, *names: str, **sink_options) -> FanOut:
    spec = FanOutSpec.of(ingest_id="fan", topics="events", sinks=[
        {"table_uri": str(tmp_path / n), **sink_options.get(n, {})} for n in names])
    return FanOut(spec, Secrets({"bootstrap.servers": "fake:9092"}), submitter, kafka)


def test_one_job_commits_every_table_to_the_same_end_each_plan_logged_in_its_table(tmp_path, kafka):
    submitter = CommittingSubmitter()
    result = fan_out(tmp_path, kafka, submitter, "b", "a").run(RunIdentity("r1"))
    uris = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert submitter.jobs == [uris]  # one Spark job, the first table's attempt naming the other
    assert [t.table_uri for t in result.tables] == uris and result.status == "committed"
    assert result.to_dict()["table_uris"] == uris and len(result.to_dict()["tables"]) == 2
    for uri in uris:
        assert offsets(uri, "events") == [10, 10]
        assert PlanLog(TableLocation.of(uri)).load("r1").batch == 1
    again = fan_out(tmp_path, kafka, submitter, "b", "a").run(RunIdentity("r1"))
    assert again.status == "already_committed" and len(submitter.jobs) == 1


def test_a_refusing_table_stays_behind_and_catches_up_from_its_own_offsets(tmp_path, kafka):
    refusing = CommittingSubmitter(refuse=(str(tmp_path / "strict"),))
    with pytest.raises(ConfigError, match=f"^{tmp_path / 'strict'}: a CHECK constraint refused"):
        fan_out(tmp_path, kafka, refusing, "raw", "strict").run(RunIdentity("r1"))
    assert offsets(str(tmp_path / "raw"), "events") == [10, 10]
    assert offsets(str(tmp_path / "strict"), "events") == [None, None]
    kafka.produce(TopicPartition("events", 0), 10, 11)
    submitter = CommittingSubmitter()
    result = fan_out(tmp_path, kafka, submitter, "raw", "strict").run(RunIdentity("r2"))
    assert {t.table_uri: [r["start"] for r in t.ranges] for t in result.tables} == {
        str(tmp_path / "raw"): [10], str(tmp_path / "strict"): [0, 0]}
    assert offsets(str(tmp_path / "raw"), "events") == offsets(str(tmp_path / "strict"), "events") == [12, 10]


class UnreachableSubmitter:
    """A Spark Connect server that cannot be reached (nothing runs, no marker says why) or that dies
    mid-batch (``lost``: the driver's marker holds the lost call, the submitter the typed error)."""

    def __init__(self, lost: str = ""):
        self.lost = lost

    def submit(self, first: Attempt, secrets: Secrets) -> None:
        if self.lost:
            StagingArea(TableLocation.of(first.table_uri)).record_error(first.attempt_id, self.lost)
        raise SparkUnavailableError("the Spark Connect server sc://127.0.0.1:1 went away. Retry when the "
                                    "server is back")


@pytest.mark.parametrize("lost", ["", "SparkConnectGrpcException: <_MultiThreadedRendezvous of RPC>"])
def test_a_server_that_fails_the_whole_job_is_every_tables_own_error_of_its_type(tmp_path, kafka, lost):
    with pytest.raises(SparkUnavailableError, match=f"^{tmp_path / 'a'}: the Spark Connect server .* went away"):
        fan_out(tmp_path, kafka, UnreachableSubmitter(lost), "a", "b").run(RunIdentity("r1"))
    with pytest.raises(SparkUnavailableError, match="^the Spark Connect server .* went away"):  # as it always was
        Ingestion(build_config(str(tmp_path / "one"), "events", {"bootstrap.servers": "fake:9092"}),
                  UnreachableSubmitter(lost), kafka).run(RunIdentity("r1"))
    assert offsets(str(tmp_path / "a"), "events") == offsets(str(tmp_path / "b"), "events") == [None, None]


def test_a_sink_added_later_starts_from_its_own_starting_offsets(tmp_path, kafka):
    fan_out(tmp_path, kafka, CommittingSubmitter(), "raw").run(RunIdentity("r1"))
    kafka.produce(TopicPartition("events", 1), 10)
    result = fan_out(tmp_path, kafka, CommittingSubmitter(), "raw", "new",
                     new={"starting_offsets": "latest"}).run(RunIdentity("r2"))
    by_table = {t.table_uri: t for t in result.tables}
    assert by_table[str(tmp_path / "raw")].status == "committed"
    assert offsets(str(tmp_path / "raw"), "events") == [10, 11]
    assert offsets(str(tmp_path / "new"), "events") == [10, 11]  # latest: it starts at the end, reads nothing


def test_a_pattern_that_matches_nothing_yet_writes_no_table(tmp_path):
    spec = FanOutSpec.of(ingest_id="fan", topic_pattern="orders.*", sinks=[{"table_uri": str(tmp_path / "{topic}")}])

    class NoTopics(FakeKafka):
        def topics(self):
            return ("events", "__consumer_offsets")

    result = FanOut(spec, Secrets({"bootstrap.servers": "fake:9092"}), CommittingSubmitter(), NoTopics()).run(
        RunIdentity("r1"))
    assert result.tables == () and result.status == "nothing_new"


def test_in_interval_mode_every_table_commits_the_runs_interval_once(tmp_path):
    base, hour = 1_767_225_600_000, 3_600_000  # 2026-01-01T00:00Z
    kafka = FakeKafka(events=2)
    for p in range(2):
        kafka.produce(TopicPartition("events", p), *(base + k * 600_000 + p for k in range(18)))
    spec = FanOutSpec.of(ingest_id="fan", topics="events", mode="interval", sinks=[
        {"table_uri": str(tmp_path / n)} for n in ("a", "b")])
    submitter = CommittingSubmitter()
    fan = FanOut(spec, Secrets({"bootstrap.servers": "fake:9092"}), submitter, kafka)
    result = fan.run(RunIdentity("hour-1"), Interval(base + hour, base + 2 * hour))
    assert [(t.status, t.batch) for t in result.tables] == [("committed", 1), ("committed", 1)]
    assert offsets(str(tmp_path / "a"), "events") == offsets(str(tmp_path / "b"), "events") == [12, 12]
    again = fan.run(RunIdentity("hour-1-cleared"), Interval(base + hour, base + 2 * hour))
    assert {t.status for t in again.tables} == {"already_committed"} and len(submitter.jobs) == 1


def test_a_table_refused_at_planning_stays_behind_while_the_others_commit_on_every_run(tmp_path):
    """Routing by {topic}: topic ``a`` is deleted and created again under the tables; only its table is
    refused (without retry), ``b``'s commits on every run; with the reset, ``a``'s catches up."""
    from airflow_eo.core.errors import TopicRecreatedError

    kafka = FakeKafka(a=1, b=1)
    for topic in "ab":
        kafka.produce(TopicPartition(topic, 0), *range(1_000, 1_010))

    def routed(**options) -> FanOut:
        spec = FanOutSpec.of(ingest_id="fan", topics="a,b", sinks=[{"table_uri": str(tmp_path / "{topic}")}],
                             **options)
        return FanOut(spec, Secrets({"bootstrap.servers": "fake:9092"}), CommittingSubmitter(), kafka)

    routed().run(RunIdentity("r1"))
    kafka.recreate("a", 1)
    for run in ("r2", "r3"):
        kafka.produce(TopicPartition("a", 0), *range(5_000, 5_004))
        kafka.produce(TopicPartition("b", 0), 2_000)
        with pytest.raises(TopicRecreatedError, match=f"^{tmp_path / 'a'}: topic 'a' was deleted and created again"):
            routed().run(RunIdentity(run))
        assert offsets(str(tmp_path / "a"), "a", 1) == [10]
    assert offsets(str(tmp_path / "b"), "b", 1) == [12]
    result = routed(on_topic_recreated="reset").run(RunIdentity("r4"))
    assert offsets(str(tmp_path / "a"), "a", 1) == [8] and result.status == "committed"
    record = Ledger.open(str(tmp_path / "a")).batches("fan", limit=1)[0]
    assert [(r.topic, r.partition, r.committed, r.start) for r in record.meta.resets] == [("a", 0, 10, 0)]


def test_leases_are_taken_in_table_uri_order_whatever_the_order_of_the_sinks(tmp_path, kafka, monkeypatch):
    """Two ingests sharing tables take their leases in one order (table_uri): neither can hold one the
    other waits for while waiting for one it holds."""
    from airflow_eo.loop.ingest import Ingestion

    taken: list[tuple[str, str]] = []
    turn = Ingestion.turn

    def recording(self, run_key, *args, **kwargs):
        taken.append((run_key, self.config.table_uri))
        return turn(self, run_key, *args, **kwargs)

    monkeypatch.setattr(Ingestion, "turn", recording)
    fan_out(tmp_path, kafka, CommittingSubmitter(), "b", "a", "c").run(RunIdentity("one"))
    kafka.produce(TopicPartition("events", 0), 10)  # something new: every table of the next run takes its turn
    fan_out(tmp_path, kafka, CommittingSubmitter(), "d", "c", "b").run(RunIdentity("two"))
    assert [uri for key, uri in taken if key == "one"] == [str(tmp_path / n) for n in "abc"]
    assert [uri for key, uri in taken if key == "two"] == [str(tmp_path / n) for n in "bcd"]


def test_a_table_with_nothing_to_do_takes_no_turn_and_writes_nothing(tmp_path, kafka, monkeypatch):
    """Nothing beyond its offsets (or its batch already in it): decided without the lease, as a preview
    decides; the table's log and lease log stay as they were."""
    from airflow_eo.loop.ingest import Ingestion

    fan_out(tmp_path, kafka, CommittingSubmitter(), "a", "b").run(RunIdentity("one"))
    versions = {n: (Ledger.open(str(tmp_path / n)).version, len(os.listdir(tmp_path / n / "_airflow_eo" / "lease" /
                                                                         "_delta_log"))) for n in "ab"}
    monkeypatch.setattr(Ingestion, "turn", lambda *a, **k: pytest.fail("a turn was taken"))
    again = fan_out(tmp_path, kafka, CommittingSubmitter(), "a", "b").run(RunIdentity("one"))
    later = fan_out(tmp_path, kafka, CommittingSubmitter(), "a", "b").run(RunIdentity("two"))
    assert again.status == "already_committed" and later.status == "nothing_new"
    assert {n: (Ledger.open(str(tmp_path / n)).version, len(os.listdir(tmp_path / n / "_airflow_eo" / "lease" /
                                                                     "_delta_log"))) for n in "ab"} == versions


def test_turns_are_taken_one_after_another_in_order_and_all_given_back_also_when_the_run_fails():
    """taking_turns: the leases in the tables' order, each entered before the next; at the end every one
    given back (side by side: a release waits for nobody), after a failure too; a table whose turn
    fails stays behind and takes no lease."""
    import threading
    from contextlib import contextmanager

    from airflow_eo.core.errors import AirflowEoError
    from airflow_eo.loop.ingest import _Table, taking_turns

    events: list[tuple[str, str]] = []
    lock = threading.Lock()

    @contextmanager
    def turn(table):
        if table.uri.endswith("refused"):
            raise AirflowEoError("its lease log cannot be read")
        with lock:
            events.append(("take", table.uri))
        try:
            yield f"held {table.uri}"
        finally:
            with lock:
                events.append(("give", table.uri))

    def tables(*names):
        return [_Table(ingestion=type("I", (), {"config": type("C", (), {"table_uri": n})()})()) for n in names]

    names = [f"t{i:02d}" for i in range(12)]
    run = tables(*names)
    with taking_turns(run, turn):
        assert events == [("take", n) for n in names]  # all held, in order, before the block runs
        assert [t.held for t in run] == [f"held {n}" for n in names]
    assert sorted(uri for what, uri in events if what == "give") == names
    events.clear()
    failing = tables("a", "b-refused", "c")
    with pytest.raises(RuntimeError, match="the run failed"):
        with taking_turns(failing, turn):
            raise RuntimeError("the run failed")
    assert events[:2] == [("take", "a"), ("take", "c")] and sorted(events[2:]) == [("give", "a"), ("give", "c")]
    assert failing[1].held is None and "cannot be read" in str(failing[1].error)


def test_a_run_that_waited_its_turn_plans_against_kafka_asked_after_the_wait(tmp_path, kafka, monkeypatch):
    """Two runs of one table: while the second waits its turn, the first commits records produced after
    the second first asked Kafka. Planning against the bounds asked before the wait would find the table's
    offsets past the topic's end (a topic recreated, to that plan); asked again after the turn, the second
    run finds the first run's batch and nothing new."""
    from airflow_eo.loop.ingest import Ingestion
    from tests.unit.fakes import answering_from

    answering_from(kafka, monkeypatch)
    turn, raced = Ingestion.turn, []

    def meanwhile(self, run_key, *args, **kwargs):
        if run_key == "second" and not raced:  # the first run takes the lease and commits while the second waits
            raced.append(True)
            for p in range(2):
                kafka.produce(TopicPartition("events", p), *range(10, 15))
            assert fan_out(tmp_path, None, CommittingSubmitter(), "a").run(RunIdentity("first")).status == "committed"
        return turn(self, run_key, *args, **kwargs)

    monkeypatch.setattr(Ingestion, "turn", meanwhile)
    second = fan_out(tmp_path, None, CommittingSubmitter(), "a").run(RunIdentity("second"))
    assert raced and second.status == "nothing_new"
    assert offsets(str(tmp_path / "a"), "events") == [15, 15]


def test_a_table_committed_past_the_runs_pinned_bounds_is_planned_against_kafka_now(tmp_path, kafka, monkeypatch):
    """A run that holds no lease (its wait timed out) plans its tables side by side: a table another run
    committed to after this run asked Kafka is judged against Kafka's bounds asked again, not as a topic
    recreated; the pinned answers of the rest stay."""
    from airflow_eo.kafka import PinnedKafka
    from airflow_eo.loop.planner import OffsetPlanner
    from tests.unit.fakes import answering_from

    answering_from(kafka, monkeypatch)
    pinned = PinnedKafka({"bootstrap.servers": "fake:9092"})
    asked = pinned.bounds([TopicPartition("events", 0), TopicPartition("events", 1)])  # the run asks first
    for p in range(2):
        kafka.produce(TopicPartition("events", p), *range(10, 15))
    other = fan_out(tmp_path, None, CommittingSubmitter(), "b")
    assert other.run(RunIdentity("other")).status == "committed"  # then another run commits to b
    (config,) = other.configs()
    plan = OffsetPlanner(config).plan(RunIdentity("mine"), Ledger.open(config.table_uri), pinned)
    assert plan.is_empty and plan.batch == 2  # b is at Kafka's end: nothing new, no recreation
    assert pinned.bounds([TopicPartition("events", 0)])[TopicPartition("events", 0)].end == 15
    assert asked[TopicPartition("events", 0)].end == 10
