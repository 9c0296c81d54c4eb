"""A Spark Connect client waits for a server that is still warming up (airflow_eo.submit.connect),
and what the warm-up and the workers' daemon load (airflow_eo.driver.reader.rehearse,
airflow_eo.driver.daemon). The server's side is tested on a real server in tests/system/test_connect.py;
here the client meets a stand-in that answers the two questions it asks: does the server announce
readiness (a static conf), and is it ready (its global temp view)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from airflow_eo.submit import connect
from airflow_eo.submit.connect import ANNOUNCES_READY_CONF, READY_VIEW, wait_until_ready


class Server:
    """The client's view of a server: its conf and its catalog (``ready_after`` polls say no first)."""

    def __init__(self, announces: bool, ready_after: int | None):
        self.announces, self.ready_after, self.polls = announces, ready_after, 0
        self.conf, self.catalog = self, self

    def get(self, key: str, default=None):
        assert key == ANNOUNCES_READY_CONF
        return "true" if self.announces else default

    def tableExists(self, name: str) -> bool:  # noqa: N802 - pyspark's name
        assert name == f"global_temp.{READY_VIEW}"
        self.polls += 1
        return self.ready_after is not None and self.polls > self.ready_after


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    monkeypatch.setattr(connect, "_ready", set())


def test_a_client_waits_until_a_warming_server_is_ready_then_asks_no_more(caplog):
    server = Server(announces=True, ready_after=3)
    with caplog.at_level(logging.INFO, logger="airflow_eo.submit.connect"):
        waited = wait_until_ready(server, "sc://h:1/;token=secret", poll=0.01)
    assert server.polls == 4 and waited > 0
    assert "still warming up" in caplog.text and "is ready (waited" in caplog.text
    assert "secret" not in caplog.text  # the URL is logged without its parameters
    assert wait_until_ready(server, "sc://h:1/;token=secret", poll=0.01) == 0.0 and server.polls == 4


def test_a_ready_server_costs_one_question_and_no_log_line(caplog):
    server = Server(announces=True, ready_after=0)
    with caplog.at_level(logging.INFO, logger="airflow_eo.submit.connect"):
        wait_until_ready(server, "sc://h:2", poll=0.01)
    assert server.polls == 1 and caplog.text == ""


def test_a_server_that_does_not_announce_readiness_is_not_waited_for():
    server = Server(announces=False, ready_after=None)  # not started by airflow-eo connect-server
    assert wait_until_ready(server, "sc://h:3", poll=0.01) < 0.5 and server.polls == 0


def test_the_wait_is_bounded_and_then_goes_ahead_with_a_warning(caplog):
    server = Server(announces=True, ready_after=None)  # a warm-up that never ends
    with caplog.at_level(logging.INFO, logger="airflow_eo.submit.connect"):
        waited = wait_until_ready(server, "sc://h:4", timeout=0.05, poll=0.01)
    assert 0.05 <= waited < 5
    assert any(r.levelno == logging.WARNING and "running the batch anyway" in r.getMessage() for r in caplog.records)


def test_the_rehearsal_runs_the_readers_record_path_without_a_broker():
    from airflow_eo.driver.reader import BATCH_ROWS, KAFKA_SCHEMA, rehearse

    batches = list(rehearse(partitions=2, rows=BATCH_ROWS + 5))
    assert all(b.schema == KAFKA_SCHEMA for b in batches)
    assert sorted({(b.column("partition")[0].as_py(), b.num_rows) for b in batches}) == [
        (0, 5), (0, BATCH_ROWS), (1, 5), (1, BATCH_ROWS)]
    offsets = [o for b in batches if b.column("partition")[0].as_py() == 0 for o in b.column("offset").to_pylist()]
    assert offsets == list(range(BATCH_ROWS + 5))


def test_a_worker_forked_from_the_daemon_imports_nothing_for_a_read_task():
    """Spark forks new workers whenever the old ones sat idle for a minute: what a read task loads
    (pandas through pyarrow's first conversion, 350 modules, 0.2-0.45 s of CPU) must be in the daemon."""
    probe = """
import json, sys, tempfile
from airflow_eo.driver import daemon
daemon.preload()
before = set(sys.modules)
from airflow_eo.driver.reader import KAFKA_SCHEMA, rehearse
from airflow_eo.driver.writer import task_writer
scratch = tempfile.mkdtemp()
list(task_writer(scratch, None, scratch + "/out", KAFKA_SCHEMA)(rehearse(), 0))
print(json.dumps(sorted(set(sys.modules) - before)))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    new = json.loads(done.stdout.strip().splitlines()[-1])
    assert not [m for m in new if m.split(".")[0] in ("pandas", "numpy", "pyarrow", "confluent_kafka")], new
