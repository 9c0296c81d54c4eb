"""The plugin's Kafka side: the embedded broker, topics, producers, and what the broker holds.

:class:`TestBroker` wraps the embedded broker (noida-db, :mod:`airflow_eo.demo.broker`: a
Kafka-protocol broker in one binary from PyPI, with transactions and read_committed) with what a
DAG's test needs: a fresh topic, records produced plain, keyed, in a committed or an aborted
transaction, or as Avro, Protobuf or JSON Schema through a Schema Registry stand-in; and :meth:`TestBroker.records`, every
record the broker holds, read with kafka-python — another client than the pipeline's
(confluent-kafka), so a bug of the reader cannot hide itself in the assertions.

Example::

    >>> broker = TestBroker.start()                                    # doctest: +SKIP
    >>> topic = broker.create_topic(partitions=3)                      # doctest: +SKIP
    >>> broker.produce(topic, [{"id": 1}, {"id": 2}])                  # doctest: +SKIP
    2
    >>> broker.produce_transaction(topic, [b"never seen"], abort=True)   # doctest: +SKIP
    1
    >>> [r.value for r in broker.records(topic)]                       # doctest: +SKIP
    [b'{"id": 1}', b'{"id": 2}']
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_eo.demo.broker import EmbeddedBroker



def encode(value: Any) -> bytes | None:
    """A record's bytes: bytes as given, text as UTF-8, a dict or list as JSON, None as None (a tombstone)."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value).encode()


@dataclass(frozen=True)
class Record:
    """One record as a consumer sees it (kafka-python): coordinates, key, value, timestamp (ms), headers."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def coordinates(self) -> tuple[str, int, int]:
        return self.topic, self.partition, self.offset

    def json(self) -> Any:
        """The value parsed as JSON (None for a tombstone)."""
        return None if self.value is None else json.loads(self.value)


@dataclass(frozen=True)
class _Endpoint:
    """A broker this process did not start (only its address)."""

    bootstrap_servers: str

    @property
    def config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap_servers}

    def close(self) -> None:
        pass


class TestBroker:
    """The embedded broker of a test session and what tests do with it."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, broker: "EmbeddedBroker | _Endpoint"):
        self.broker = broker

    @classmethod
    def start(cls) -> "TestBroker":
        return cls(EmbeddedBroker().start())

    @classmethod
    def connect(cls, bootstrap_servers: str) -> "TestBroker":
        """The same helpers and assertions against a broker already running (plaintext, no auth)."""
        return cls(_Endpoint(bootstrap_servers))

    def close(self) -> None:
        self.broker.close()

    @property
    def bootstrap_servers(self) -> str:
        return self.broker.bootstrap_servers

    @property
    def config(self) -> dict[str, str]:
        """The client config (librdkafka keys) that reaches the broker."""
        return dict(self.broker.config)

    def airflow_connection(self) -> str:
        """The broker as an Airflow ``kafka`` connection (the value of an ``AIRFLOW_CONN_*`` variable)."""
        return json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": self.bootstrap_servers}})

    # -- topics ------------------------------------------------------------------
    def create_topic(self, partitions: int = 3, name: str | None = None) -> str:
        """A new topic (a fresh name unless given); returns its name."""
        from confluent_kafka.admin import AdminClient, NewTopic

        name = name or f"t-{uuid.uuid4().hex[:10]}"
        admin = AdminClient(self.config)
        for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
            future.result()
        return name

    def add_partitions(self, topic: str, total: int) -> None:
        from confluent_kafka.admin import AdminClient, NewPartitions

        admin = AdminClient(self.config)  # kept alive until the futures resolve
        for future in admin.create_partitions([NewPartitions(topic, total)]).values():
            future.result()

    def recreate_topic(self, topic: str, partitions: int = 3, timeout: float = 30.0) -> None:
        """Delete ``topic`` and create it again under its name, empty (its offsets start at 0 again)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(self.config)
        for future in admin.delete_topics([topic]).values():
            future.result()
        deadline = time.monotonic() + timeout
        while True:  # the deletion completes asynchronously: creating too early is refused
            try:
                for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
                    future.result()
                return
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def partitions(self, topic: str) -> list[int]:
        from confluent_kafka.admin import AdminClient

        found = AdminClient(self.config).list_topics(topic, timeout=10).topics.get(topic)
        if found is None or found.error is not None:
            raise ValueError(f"topic {topic!r} does not exist on the test broker")
        return sorted(found.partitions)

    # -- producers ---------------------------------------------------------------
    def produce(self, topic: str, values: Iterable[Any], *, keys: Iterable[Any] | None = None,
                partition: int | None = None, timestamps: Iterable[int] | None = None,
                headers: Iterable[Mapping[str, Any]] | None = None) -> int:
        """Produce ``values`` (idempotent producer) and wait for them; returns how many. Without keys or
        ``partition`` they go round-robin over the partitions; with ``keys`` the producer's partitioner
        places them (one key, one partition); ``timestamps`` are CreateTime epoch ms (keep them within
        the broker's 7-day retention)."""
        from confluent_kafka import Producer

        producer = Producer({**self.config, "enable.idempotence": True, "linger.ms": 5})
        count = self._send(producer, topic, values, keys, partition, timestamps, headers)
        producer.flush(30)
        return count

    def produce_keyed(self, topic: str, items: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> int:
        """Produce ``(key, value)`` pairs (a mapping or pairs), each key to its partition."""
        pairs = list(items.items() if isinstance(items, Mapping) else items)
        return self.produce(topic, [v for _, v in pairs], keys=[k for k, _ in pairs])

    def produce_transaction(self, topic: str, values: Iterable[Any], *, keys: Iterable[Any] | None = None,
                            partition: int | None = None, abort: bool = False) -> int:
        """Produce ``values`` in one transaction, committed, or aborted (``abort=True``: a
        read_committed consumer never sees them, but they take offsets); returns how many."""
        from confluent_kafka import Producer

        producer = Producer({**self.config, "transactional.id": f"airflow-eo-test-{uuid.uuid4().hex[:10]}"})
        producer.init_transactions(30)
        producer.begin_transaction()
        count = self._send(producer, topic, values, keys, partition, None, None)
        if abort:
            # on the broker before the abort (abort_transaction drops what is still queued): the records
            # take offsets and only read_committed hides them. Each transaction has a producer of its own:
            # noida-db would hide later committed records of a producer that aborted (Kafka does not)
            producer.flush(30)
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
        return count

    def produce_avro(self, topic: str, records: Iterable[Mapping[str, Any]], schema: str, registry_config: Mapping,
                     *, keys: Iterable[Any] | None = None, subject_topic: str | None = None) -> int:
        """Produce Avro ``records`` in the Confluent wire format with confluent-kafka's ``AvroSerializer``,
        which registers ``schema`` under ``<subject_topic or topic>-value`` in the registry of
        ``registry_config`` (the ``schema_registry`` fixture's ``config``); returns how many."""
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        serialize = AvroSerializer(SchemaRegistryClient(dict(registry_config)), schema)
        context = SerializationContext(subject_topic or topic, MessageField.VALUE)
        return self.produce(topic, [serialize(dict(r), context) for r in records], keys=keys)

    def produce_protobuf(self, topic: str, messages: Iterable[Any], registry_config: Mapping, *,
                         keys: Iterable[Any] | None = None, subject_topic: str | None = None) -> int:
        """Produce Protobuf ``messages`` (instances of one message class: generated code, or a class of
        ``google.protobuf.message_factory``) in the Confluent wire format with confluent-kafka's
        ``ProtobufSerializer``, which registers the message's file (its imports as references) under
        ``<subject_topic or topic>-value``; returns how many."""
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        messages = list(messages)
        if not messages:
            return 0
        serialize = ProtobufSerializer(type(messages[0]), SchemaRegistryClient(dict(registry_config)))
        context = SerializationContext(subject_topic or topic, MessageField.VALUE)
        return self.produce(topic, [serialize(m, context) for m in messages], keys=keys)

    def produce_json_schema(self, topic: str, records: Iterable[Any], schema: str, registry_config: Mapping, *,
                            keys: Iterable[Any] | None = None, subject_topic: str | None = None,
                            validate: bool = True) -> int:
        """Produce JSON ``records`` in the Confluent wire format with confluent-kafka's ``JSONSerializer``,
        which registers ``schema`` under ``<subject_topic or topic>-value``; ``validate=False`` lets
        records the schema refuses through (to test what a reader does with them); returns how many."""
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.json_schema import JSONSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        serialize = JSONSerializer(schema, SchemaRegistryClient(dict(registry_config)), conf={"validate": validate})
        context = SerializationContext(subject_topic or topic, MessageField.VALUE)
        return self.produce(topic, [serialize(r, context) for r in records], keys=keys)

    def _send(self, producer, topic: str, values, keys, partition, timestamps, headers) -> int:
        values = list(values)
        keys = list(keys) if keys is not None else None
        times = list(timestamps) if timestamps is not None else None
        heads = list(headers) if headers is not None else None
        spread = len(self.partitions(topic)) if partition is None and keys is None else None
        for i, value in enumerate(values):
            kwargs: dict[str, Any] = {"value": encode(value)}
            if keys is not None:
                kwargs["key"] = encode(keys[i])
            if partition is not None or spread:
                kwargs["partition"] = partition if partition is not None else i % spread
            if times is not None:
                kwargs["timestamp"] = times[i]
            if heads is not None:
                kwargs["headers"] = [(k, encode(v)) for k, v in heads[i].items()]
            while True:
                try:
                    producer.produce(topic, **kwargs)
                    break
                except BufferError:  # the client's queue is full: let deliveries drain
                    producer.poll(0.5)
            producer.poll(0)
        return len(values)

    # -- what the broker holds (kafka-python) --------------------------------------
    def records(self, topic: str, read_committed: bool = True) -> list[Record]:
        """Every record of ``topic`` a consumer sees from the start: read_committed (the default: no
        record of an aborted or open transaction) or read_uncommitted. Read with kafka-python."""
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap_servers, enable_auto_commit=False,
                                 isolation_level="read_committed" if read_committed else "read_uncommitted",
                                 consumer_timeout_ms=3000)
        found: list[Record] = []
        try:
            tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            ends = consumer.end_offsets(tps)
            while any(consumer.position(tp) < ends[tp] for tp in tps):
                batch = consumer.poll(timeout_ms=1000)
                if not batch:
                    break
                for records in batch.values():
                    found += [Record(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp,
                                     tuple(r.headers or ())) for r in records]
        finally:
            consumer.close()
        return sorted(found, key=lambda r: (r.partition, r.offset))

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Each partition's last stable offset (read_committed end, kafka-python): where a table
        that has read everything committed has its offsets."""
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap_servers, enable_auto_commit=False,
                                 isolation_level="read_committed")
        try:
            tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
            return {tp.partition: end for tp, end in consumer.end_offsets(tps).items()}
        finally:
            consumer.close()
