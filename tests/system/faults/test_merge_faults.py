"""A merge batch (write_mode="merge") killed at each step through spark-submit, then retried: the table
still equals the model of the broker's records (tests/changes.py), with transactions aborted and
committed, and nothing half-done is ever visible.

Budget: one chain of 4 kills and a clean retry (5 spark-submits) over two batches of changes.
"""

from __future__ import annotations

import random

import pytest

from airflow_eo.core.errors import SparkJobError
from airflow_eo.loop.config import IngestConfig
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.table.ledger import Ledger
from tests.changes import SQL, ChangeProducer, assert_model_holds, table_version
from tests.helpers import new_topic
from tests.system.faults.harness import run_once

pytestmark = pytest.mark.faults

INGEST_ID = "merge_faults"
WINDOWS = ("reading", "after_stage", "during_commit", "after_commit")


def test_a_merge_killed_at_each_step_and_retried_keeps_the_model(kafka_config, tmp_path):
    bootstrap = kafka_config["bootstrap.servers"]
    topic = new_topic(kafka_config, 3)
    changes = ChangeProducer(kafka_config, topic)
    uri = str(tmp_path / "table")
    config = IngestConfig(table_uri=uri, ingest_id=INGEST_ID, topics=[topic], kafka_config=kafka_config,
                          write_mode="merge", merge_key="id", transform_sql=SQL)
    rng = random.Random(24)
    changes.write(range(1500))
    changes.transaction(writes=range(2000, 2100), deletes=range(0, 100), abort=True)
    changes.flush()
    assert run_once(config, "first", None, rng).result.status == RunStatus.COMMITTED
    assert_model_holds(uri, INGEST_ID, bootstrap, topic)
    changes.write(range(0, 1500, 3))
    changes.delete(range(700, 900))
    changes.transaction(writes=range(800, 820), deletes=range(5, 25))
    changes.flush()
    last = Ledger.open(uri).last_batch(INGEST_ID)
    for window in WINDOWS:  # one run key, killed in each window in turn: the retries of one task
        version = table_version(uri)
        outcome = run_once(config, "second", window, rng)
        assert outcome.killed, window
        if window == "after_commit":  # died after its commit: the batch is in, the retry will say so
            assert Ledger.open(uri).last_batch(INGEST_ID) == last + 1
        else:  # died before: the table and its offsets as they were
            assert isinstance(outcome.error, SparkJobError) and "unchanged" in str(outcome.error), outcome.error
            assert table_version(uri) == version and Ledger.open(uri).last_batch(INGEST_ID) == last
        assert_model_holds(uri, INGEST_ID, bootstrap, topic)
    retry = run_once(config, "second", None, rng)
    assert retry.result.status == RunStatus.ALREADY_COMMITTED and not retry.result.spark_started
    assert_model_holds(uri, INGEST_ID, bootstrap, topic)
