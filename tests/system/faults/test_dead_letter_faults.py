"""A batch's dead letters land once, whatever commits between its main commit and theirs.

The batch's ``airflow-eo ingest`` is killed with its whole process group (the CLI, spark-submit's JVM
and the Python driver) at ``before_dead_letters``: its main commit landed, its dead letters are staged
but not committed. Then another run commits first: in interval mode a batch planned as the same number
and rebased past it, in offset mode a racing run planned from the same offsets (it loses, retries and
commits the next batch). Then the killed run's retry. The dead-letter table holds each undecodable
record once (checked by ``airflow-eo audit --dead-letter-table``, which reconciles both tables with Kafka).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from airflow_eo.cli import main
from airflow_eo.core.errors import CommitConflictError
from airflow_eo.core.intervals import interval_of
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.driver.main import InProcessSubmitter
from airflow_eo.table.ledger import Ledger
from airflow_eo.testing.kafka import TestBroker
from tests.conftest import build_ingestion
from tests.helpers import new_topic, read_table

pytestmark = pytest.mark.faults

CLI = os.path.join(os.path.dirname(sys.executable), "airflow-eo")
H = 3_600_000
SCHEMA = ["--value-schema", "id INT", "--transform-sql", "SELECT topic, partition, offset, data.id AS id FROM source"]


def killed_ingest(kafka_config, table: str, dlq: str, topic: str, run_key: str, scratch: str, *extra: str,
                  failpoints: str = "") -> subprocess.CompletedProcess:
    """``airflow-eo ingest`` as a task runs it, in a session of its own (a group kill takes exactly its processes)."""
    cmd = [CLI, "ingest", "--table", table, "--ingest-id", "dl", "--topics", topic, "--dead-letter-table", dlq,
           "--bootstrap-servers", kafka_config["bootstrap.servers"], "--run-key", run_key, "--json",
           "--master", "local[1]", "--conf", "spark.ui.enabled=false", *SCHEMA, *extra]
    env = {**os.environ, "AIRFLOW_EO_SCRATCH_DIR": scratch, "AIRFLOW_EO_FAILPOINTS": failpoints}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, start_new_session=True)


def values(first: int, count: int, broken_every: int) -> list[bytes]:
    return [b"{broken %d" % i if i % broken_every == 0 else b'{"id": %d}' % i for i in range(first, first + count)]


def assert_dead_letters_once(kafka_config, table: str, dlq: str, capsys) -> None:
    """Each undecodable record of the topic is in the dead-letter table once, and the audit of both
    tables against Kafka finds nothing lost or doubled."""
    letters = read_table(dlq, ["partition", "offset", "batch"])
    keys = list(zip(letters["partition"].to_pylist(), letters["offset"].to_pylist()))
    assert len(keys) == len(set(keys)), "a dead letter is in the dead-letter table twice"
    assert main(["audit", table, "--ingest-id", "dl", "--dead-letter-table", dlq, "--all", "--json",
                 "--bootstrap-servers", kafka_config["bootstrap.servers"]]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["drift"] == 0, report["findings"]
    counts = report["counts"]
    assert counts.get("dead_lettered", 0) == len(keys) and not counts.get("lost")


@pytest.fixture
def scratch(tmp_path):
    (tmp_path / "scratch").mkdir()
    return str(tmp_path / "scratch")


def test_a_rebased_interval_batch_committing_first_loses_none_of_the_killed_batchs_dead_letters(
        kafka_config, spark, tmp_path, scratch, capsys):
    topic, table, dlq = new_topic(kafka_config, 1), str(tmp_path / "t"), str(tmp_path / "dlq")
    broker = TestBroker.connect(kafka_config["bootstrap.servers"])
    base = (int(time.time() * 1000) // H - 5) * H
    h0, h1 = interval_of(base, base + H), interval_of(base + H, base + 2 * H)
    broker.produce(topic, values(0, 30, 4), partition=0, timestamps=[base + 1000 * i for i in range(30)])
    broker.produce(topic, values(30, 20, 1000), partition=0, timestamps=[base + H + 1000 * i for i in range(20)])
    broker.produce(topic, [b'{"id": 99}'], partition=0, timestamps=[base + 3 * H])  # closes both intervals

    # run B plans interval H1 as batch 1 (its plan logged), before run A commits H0 as batch 1
    ing_b = build_ingestion(table, topic, kafka_config, InProcessSubmitter(spark), ingest_id="dl", mode="interval",
                            value_schema="id INT", dead_letter_table_uri=dlq,
                            transform_sql="SELECT topic, partition, offset, data.id AS id FROM source")
    step_b, ledger_b = ing_b.prepare(RunIdentity("run-b"), h1)
    assert step_b.plan.batch == 1

    interval = ["--interval-start", str(h0.start_ms), "--interval-end", str(h0.end_ms)]
    killed = killed_ingest(kafka_config, table, dlq, topic, "run-a", scratch, *interval,
                           failpoints="before_dead_letters@group")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    ledger = Ledger.open(table)
    assert ledger.last_batch("dl") == 1 and not Ledger.open(dlq).transaction("airflow-eo:dl:dlq")  # main, no dead letters

    result_b = ing_b.execute(step_b.plan, None, ledger_b.features.pinned())  # rebased: it commits as batch 2
    assert (result_b.status, result_b.batch) == ("committed", 2)

    retry = killed_ingest(kafka_config, table, dlq, topic, "run-a", scratch, *interval)
    assert retry.returncode == 0, retry.stderr[-3000:]
    assert json.loads(retry.stdout)["status"] == "already_committed"
    letters = read_table(dlq, ["offset", "batch"])
    assert sorted(letters["offset"].to_pylist()) == [0, 4, 8, 12, 16, 20, 24, 28]
    assert set(letters["batch"].to_pylist()) == {1}
    assert_dead_letters_once(kafka_config, table, dlq, capsys)


def test_a_racing_offset_run_committing_next_loses_none_of_the_killed_batchs_dead_letters(
        kafka_config, spark, tmp_path, scratch, capsys):
    topic, table, dlq = new_topic(kafka_config, 2), str(tmp_path / "t"), str(tmp_path / "dlq")
    broker = TestBroker.connect(kafka_config["bootstrap.servers"])
    broker.produce(topic, values(0, 40, 5))
    ing_b = build_ingestion(table, topic, kafka_config, InProcessSubmitter(spark), ingest_id="dl",
                            value_schema="id INT", dead_letter_table_uri=dlq, table_wait_timeout=0,
                            transform_sql="SELECT topic, partition, offset, data.id AS id FROM source")
    step_b, ledger_b = ing_b.prepare(RunIdentity("run-b"))  # planned from the same offsets as run A
    killed = killed_ingest(kafka_config, table, dlq, topic, "run-a", scratch, failpoints="before_dead_letters@group")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    with pytest.raises(CommitConflictError):  # B raced A and lost: nothing of it landed
        ing_b.execute(step_b.plan, None, ledger_b.features.pinned())
    broker.produce(topic, values(40, 20, 5))
    result_b = ing_b.run(RunIdentity("run-b"))  # its retry plans the next batch
    assert (result_b.status, result_b.batch) == ("committed", 2)
    retry = killed_ingest(kafka_config, table, dlq, topic, "run-a", scratch)
    assert retry.returncode == 0 and json.loads(retry.stdout)["status"] == "already_committed", retry.stderr[-3000:]
    letters = read_table(dlq, ["offset", "batch"])
    assert sorted(letters["batch"].to_pylist()) == [1] * 8 + [2] * 4
    assert_dead_letters_once(kafka_config, table, dlq, capsys)
