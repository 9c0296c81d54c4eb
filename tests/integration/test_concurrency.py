"""Runs racing and runs in parallel, on real parts: broker, Spark (the session's), Delta table.

- two runs with different run keys racing for one range: the winner commits, the loser
  gets a (retryable) conflict and never claims the winner's batch; its retry plans anew;
- runs of one table take turns (a run waits while an attempt on its table is running);
  runs of different tables, e.g. a mapped ingest over two tables, run at the same time.
"""

from __future__ import annotations

import functools
import threading
import time

import pytest

from airflow_eo.driver.main import InProcessSubmitter
from airflow_eo.core.errors import CommitConflictError
from airflow_eo.core.planning import CommitCheck
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.staging import new_attempt_id
from tests.helpers import assert_exactly_once, new_topic, produce


@pytest.fixture
def ingestion(ingestion):
    return functools.partial(ingestion, ingest_id="race")


def test_the_race_loser_gets_a_conflict_not_the_winners_batch(broker, kafka_config, spark, table_uri, ingestion):
    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 40, partitions=2)
    ing = ingestion(table_uri, topic, kafka_config, InProcessSubmitter(spark))
    loser = ing.plan(RunIdentity("dag/loser/ingest/-1"))
    ing.plans.record(loser)  # the loser logged its plan, then the winner ran the same range
    winner = ing.run(RunIdentity("dag/winner/ingest/-1"))
    assert winner.status == "committed" and winner.rows == 40

    assert Ledger.open(table_uri).state_of(loser) is CommitCheck.CONFLICT  # same ranges, other run
    with pytest.raises(CommitConflictError) as lost:
        ing.execute(loser)  # the loser's attempt reaches the compare-and-set
    assert lost.value.retryable
    record = Ledger.open(table_uri).find_batch("race", batch=1)
    assert record.meta.run_key == "dag/winner/ingest/-1" and record.meta.attempt_id == winner.attempt_id
    # its retry plans anew from the table: nothing new, nothing claimed
    retry = ing.run(RunIdentity("dag/loser/ingest/-1"))
    assert retry.status == "nothing_new" and retry.batch is None and retry.attempt_id is None
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic], "race") == 40


def test_runs_of_one_table_take_turns_runs_of_two_tables_do_not(broker, kafka_config, spark, tmp_path, ingestion):
    topic_a, topic_b = new_topic(kafka_config), new_topic(kafka_config)
    produce(kafka_config, topic_a, 30)
    produce(kafka_config, topic_b, 20)
    table_a, table_b = str(tmp_path / "a"), str(tmp_path / "b")
    a = ingestion(table_a, topic_a, kafka_config, InProcessSubmitter(spark), ingest_id="table_a")
    b = ingestion(table_b, topic_b, kafka_config, InProcessSubmitter(spark), ingest_id="table_b")

    # an attempt on table a is running (recorded, driver alive: this process)
    plan = a.plan(RunIdentity("other-run"))
    running = a.config.attempt(plan.with_attempt(new_attempt_id()))
    a.staging.begin_attempt(running)
    a.staging.driver_started(running.attempt_id)
    assert b.wait_for_turn(timeout=5) < 0.5  # another table: no wait
    started = time.monotonic()
    ended = threading.Timer(1.5, a.staging.end_attempt, args=(running.attempt_id,))
    ended.start()
    waited = a.wait_for_turn(timeout=30, poll=0.2)  # same table: waits until that attempt ends
    assert 1.4 <= waited < 10 and time.monotonic() - started >= 1.4
    assert a.wait_for_turn(timeout=0.5) < 0.5  # bounded: never longer than the timeout
    a.staging.begin_attempt(running.__class__.from_json(running.to_json()))  # running again
    assert 0.4 <= a.wait_for_turn(timeout=0.5, poll=0.1) < 2

    # two tables in parallel (what a mapped ingest over two tables does): both commit at once
    a.staging.end_attempt(running.attempt_id)
    results = {}
    threads = [threading.Thread(target=lambda name, ing: results.__setitem__(name, ing.run(RunIdentity(name))),
                                args=(name, ing)) for name, ing in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results["a"].status == results["b"].status == "committed"
    assert assert_exactly_once(table_a, broker.bootstrap_servers, [topic_a], "table_a") == 30
    assert assert_exactly_once(table_b, broker.bootstrap_servers, [topic_b], "table_b") == 20
