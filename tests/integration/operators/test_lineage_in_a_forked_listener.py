"""OpenLineage facets under the provider's default: the listener forks a child per event.

deltalake's runtime panics in a forked child ("Forked process detected") and a connection
lookup there would share the task's supervisor socket, so the facet methods must use only
what ``execute`` recorded. The child here is a real ``os.fork()`` of a process that has
already used deltalake (the run committed through it), as the task process has.

The child also runs a garbage collection first, as the provider's event building does: a
Kafka client of the task left in a reference cycle would be destroyed there and wait forever
for librdkafka threads the child does not have (seen in a real ``airflow standalone``).
"""

from __future__ import annotations

import gc
import json
import os
import signal

from openlineage.client.serde import Serde

from tests.helpers import new_topic, produce
from tests.integration.operators.conftest import context_for, make_operator


def kafka_clients() -> int:
    """How many librdkafka clients (admin, consumer, producer) this process holds, garbage included."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    # by type(): isinstance() asks an object its __class__, and a lazy module's proxy imports on that
    # (Airflow's python operator module then wanted cloudpickle)
    return sum(issubclass(type(o), (AdminClient, Consumer, Producer)) for o in gc.get_objects())


def facets_in_a_forked_child(method) -> dict:
    """Call ``method(None)`` in a forked child, as the provider does, and return its lineage as JSON."""
    # the worker's garbage from earlier tests (a Kafka client of another test in a reference cycle) is
    # collected here, not in the child, where destroying it would hang: what this test holds to account is
    # the operator's own, counted around execute() below
    gc.collect()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: like the provider's, it always exits here
        try:
            # a hung child dies of SIGALRM: the default action, not pytest-timeout's handler, which a child
            # stuck in native code (a librdkafka destructor joining threads) would never run
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(30)
            gc.collect()
            lineage = method(None)
            out = {"inputs": [json.loads(Serde.to_json(d)) for d in lineage.inputs],
                   "outputs": [json.loads(Serde.to_json(d)) for d in lineage.outputs],
                   "run_facets": {k: json.loads(Serde.to_json(v)) for k, v in lineage.run_facets.items()}}
            os.write(write, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code != -signal.SIGALRM, "the forked child hung (a native client of the task destroyed in the child?)"
    assert code == 0, f"the forked child died ({code}: a panic aborts it)"
    assert chunks, "the forked child wrote no lineage"
    return json.loads(b"".join(chunks))


def test_facets_in_a_forked_child_name_the_topic_the_table_and_its_columns(hooks, kafka_env, kafka_config,
                                                                            table_uri):
    topic = new_topic(kafka_config)
    produce(kafka_config, topic, 7)
    op = make_operator("lineage_fork", table_uri, topic, kafka_env, ingest_id="orders_fork")
    start = facets_in_a_forked_child(lambda _: op.get_openlineage_facets_on_start())  # before execute: the table
    assert start["inputs"] == [] and [o["name"] for o in start["outputs"]] == [table_uri]

    gc.disable()  # whether the collector runs between execute and the fork is chance: here it does not
    try:
        before = kafka_clients()
        summary = op.execute(context_for(op, "manual__1"))
        # a client left for a collection would be destroyed in the listener's child, where its
        # destructor can wait forever for librdkafka threads that were not forked
        assert kafka_clients() == before
    finally:
        gc.enable()
    complete = facets_in_a_forked_child(op.get_openlineage_facets_on_complete)
    host, port = kafka_config["bootstrap.servers"].split(",")[0].rsplit(":", 1)
    assert [(d["namespace"], d["name"]) for d in complete["inputs"]] == [(f"kafka://{host}:{port}", topic)]
    (out,) = complete["outputs"]
    assert (out["namespace"], out["name"]) == ("file", table_uri)
    assert [f["name"] for f in out["facets"]["schema"]["fields"]] == ["topic", "partition", "offset", "body"]
    assert out["outputFacets"]["outputStatistics"]["rowCount"] == 7
    assert complete["run_facets"]["airflow_eo"]["batch"] == summary["batch"] == 1
    # the secret of the connection is nowhere in what lineage carries
    assert "s3cr3t" not in json.dumps(complete)

    failed = facets_in_a_forked_child(op.get_openlineage_facets_on_failure)
    assert [d["name"] for d in failed["inputs"]] == [topic]
