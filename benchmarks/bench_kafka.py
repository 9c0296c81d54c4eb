"""Kafka side of the benchmark: load the data set, and the raw fetch ceiling.

The raw fetch rate is the Kafka client alone (confluent-kafka, read_committed) reading the
same offset ranges as the Spark runs, one process per partition, no Spark and no Arrow: the
practical ceiling of any reader built on this client. The same harness also times the
project's own reader (:func:`airflow_eo.driver.reader.read_range`, which builds Arrow batches)
so a gap between the ceiling and Spark can be split into "client + Arrow" and "Spark".
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from airflow_eo.core.offsets import OffsetRange

# noida-db answers a fetch with everything up to the end of the partition, ignoring the
# client's fetch.max.bytes: at ~2.5 M records of 200 bytes one response is ~500 MB, beyond
# librdkafka's default receive.message.max.bytes (100 MB); one consumer of all 4 partitions of
# the 10M-record set gets ~2.1 GB at once. Raise the client's limit to librdkafka's maximum
# (2^31 - 1) so the large runs can read at all. Apache Kafka honours fetch sizes.
CLIENT_EXTRA = {"receive.message.max.bytes": 2**31 - 1}


def create_topic(config: dict, name: str, partitions: int) -> None:
    admin = AdminClient(config)  # keep a reference until the futures resolve
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result()


def produce(producer: Producer, topic: str, **record) -> None:
    """``producer.produce``, waiting while the client's local queue is full (a fast loop outruns it)."""
    while True:
        try:
            producer.produce(topic, **record)
            return
        except BufferError:  # local queue full: let deliveries drain
            producer.poll(0.1)


def load(config: dict, topic: str, records: int, partitions: int, value_bytes: int,
         progress_every: int = 250_000) -> float:
    """Produce ``records`` records (12-byte key, ``value_bytes`` value) round-robin; seconds taken."""
    producer = Producer({**config, "linger.ms": 50, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 1_000_000, "enable.idempotence": True})
    value = b"v" * value_bytes
    started = time.monotonic()
    for i in range(records):
        produce(producer, topic, key=b"%012d" % i, value=value, partition=i % partitions)
        if progress_every and i and i % progress_every == 0:
            producer.poll(0)
            print(f"  loading {topic}: {i:,}/{records:,} records ({time.monotonic() - started:.0f}s)",
                  file=sys.stderr, flush=True)
    remaining = producer.flush(600)
    if remaining:
        raise RuntimeError(f"{remaining} records of {topic} were not delivered")
    return time.monotonic() - started


def _consume_bare(config: dict, r: OffsetRange) -> int:
    consumer = Consumer({**config, "group.id": "bench-raw", "isolation.level": "read_committed",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "auto.offset.reset": "error"})
    consumer.assign([KafkaTopicPartition(r.topic, r.partition, r.start)])
    count = 0
    try:
        while True:
            done = False
            for m in consumer.consume(10_000, 1.0):
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(err.str())
                    done = True
                    continue
                if m.offset() >= r.end:
                    done = True
                    break
                count += 1
                done = m.offset() >= r.end - 1
            if done:
                return count
    finally:
        consumer.close()


def _consume_reader(config: dict, r: OffsetRange) -> int:
    from airflow_eo.driver.reader import read_range

    return sum(batch.num_rows for batch in read_range(config, r))


def _worker(kind: str, config: dict, r: OffsetRange, barrier, results) -> None:
    barrier.wait()
    started = time.time()
    count = (_consume_bare if kind == "bare" else _consume_reader)(config, r)
    results.put((started, time.time(), count))


def fetch_rate(config: dict, ranges: list[OffsetRange], kind: str = "bare") -> dict:
    """Read ``ranges`` with one process per range; wall time from the common start to the last end."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(len(ranges)), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(kind, config, r, barrier, results)) for r in ranges]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a {kind} fetch worker exited with {p.exitcode}")
    records = sum(o[2] for o in outcomes)
    expected = sum(r.size for r in ranges)
    if records != expected:
        raise RuntimeError(f"{kind} fetch read {records} records, expected {expected}")
    seconds = max(o[1] for o in outcomes) - min(o[0] for o in outcomes)
    return {"seconds": seconds, "records": records}
