"""What Kafka holds: partitions, offset bounds (read_committed) and offsets by timestamp; and the
one place airflow-eo's Kafka clients are made (:func:`client_config`, :func:`new_consumer`, the
AdminClient of :class:`KafkaOffsets`), whoever reads with them (the read tasks, the audit, the mirror).

Uses confluent-kafka (librdkafka): on these machines it fetched ~4x faster than
kafka-python, and its AdminClient asks ListOffsets with an isolation level, which
gives the *last stable offset* (LSO) of a partition: everything below it is decided
(committed, aborted, or a transaction marker), so a plan that ends at the LSO can be
replayed and reads the same records every time.

Example::

    >>> kafka = KafkaOffsets({"bootstrap.servers": "127.0.0.1:9092"})      # doctest: +SKIP
    >>> kafka.bounds(kafka.partitions(["orders"]))                         # doctest: +SKIP
    {TopicPartition(topic='orders', partition=0): PartitionBounds(..., log_start=0, end=1500)}
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
import time
from typing import Mapping, Sequence

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicCollection
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from airflow_eo.core.errors import ConfigError, KafkaUnavailableError
from airflow_eo.core.identity import STAMP_LOOK_BACK, normal_topic_id
from airflow_eo.core.planning import StartingPosition, check_start
from airflow_eo.core.offsets import EARLIEST, LATEST, PartitionBounds, RecordStamp, TopicPartition

log = logging.getLogger(__name__)

SECRET_HINTS = ("password", "secret", "token", "key", "jaas", "credentials")
# librdkafka's word that no broker can be reached: a plan waits this long after it before failing
_UNREACHABLE = (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE)
UNREACHABLE_AFTER = 3.0


# librdkafka callback options. In the config that travels to the Spark job (JSON) a callback
# is an importable "package.module.function" path, resolved by each process that opens a
# client; Amazon MSK IAM is the path below plus the cluster's region.
CALLBACK_KEYS = ("error_cb", "throttle_cb", "stats_cb", "log_cb", "oauth_cb", "on_commit")
MSK_IAM_CALLBACK = "airflow_eo.kafka.msk_iam_oauth_cb"
MSK_IAM_REGION = "airflow_eo.msk_iam_region"  # ours: removed before the config reaches librdkafka


def msk_iam_oauth_cb(region: str, _config_str: str = "") -> tuple[str, float]:
    """OAUTHBEARER token for Amazon MSK IAM (needs ``aws-msk-iam-sasl-signer-python``)."""
    from aws_msk_iam_sasl_signer import MSKAuthTokenProvider

    token, expiry_ms = MSKAuthTokenProvider.generate_auth_token(region)
    return token, expiry_ms / 1000


def _resolve_callback(key: str, path: object, region: object) -> object:
    if not isinstance(path, str):
        return path
    module, _, name = path.replace(":", ".").rpartition(".")
    try:
        func = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(
            f"Kafka callback {key}={path!r} cannot be imported here ({exc}): install its package "
            "where the Spark driver and executors run"
        ) from exc
    return functools.partial(func, str(region)) if path == MSK_IAM_CALLBACK else func


def client_config(config: Mapping[str, object]) -> dict[str, object]:
    """A librdkafka config from the portable one: callback paths imported, our keys removed."""
    if not config.get("bootstrap.servers"):
        raise ConfigError(
            "the Kafka client config has no 'bootstrap.servers': set it in the Kafka "
            "connection's extra, e.g. {\"bootstrap.servers\": \"broker:9092\"}"
        )
    out = {k: v for k, v in config.items() if k != MSK_IAM_REGION}
    for key in CALLBACK_KEYS:
        if key in out:
            out[key] = _resolve_callback(key, out[key], config.get(MSK_IAM_REGION))
    return {**out, "log_level": int(config.get("log_level", 3))}


def new_consumer(config: Mapping[str, object], settings: Mapping[str, object] | None = None,
                 defaults: Mapping[str, object] | None = None) -> Consumer:
    """A librdkafka consumer on ``config`` (a client config as :func:`client_config` makes it): ``defaults``
    a connection may change, ``settings`` (group id, isolation level...) it may not."""
    return Consumer({**(defaults or {}), **config, **(settings or {})})


class _Reachability:
    """Since when librdkafka has reported the cluster unreachable (None: it has not).

    The AdminClient's ``error_cb`` is this object's method, not one of :class:`KafkaOffsets`:
    a bound method of the owner would make owner → client → callback → owner a reference
    cycle, which only the cyclic garbage collector frees. A forked child (the OpenLineage
    listener forks the task process) then runs that collection and destroys the client
    there, where librdkafka's threads do not exist: ``rd_kafka_destroy`` waits for them
    forever. Without the cycle the client goes when its owner does, in the process that made it.
    """

    def __init__(self, user_callback: object):
        self.user_callback = user_callback
        self.down_since: float | None = None

    def on_error(self, error: KafkaError) -> None:
        if error.code() in _UNREACHABLE:
            self.down_since = self.down_since or time.monotonic()
        if callable(self.user_callback):
            self.user_callback(error)


class KafkaOffsets:
    """Offset queries against the cluster (AdminClient). One instance per plan."""

    def __init__(self, config: Mapping[str, object], timeout: float = 30.0):
        self.config = client_config(config)
        self.timeout = timeout
        self._reachability = _Reachability(self.config.get("error_cb"))
        admin_config = {k: v for k, v in self.config.items() if k not in ("group.id",)}
        admin_config["error_cb"] = self._reachability.on_error
        try:
            self.admin = AdminClient(admin_config)
        except (KafkaException, TypeError, ValueError) as exc:
            raise ConfigError(
                f"the Kafka client config is not valid ({exc}): fix the Kafka connection's extra "
                "(librdkafka property names, e.g. bootstrap.servers, security.protocol); nothing was changed"
            ) from exc

    def metadata(self):
        """The cluster's metadata. Asked in short slices, so that a cluster librdkafka reports
        unreachable (every broker down, an unresolvable host) for :data:`UNREACHABLE_AFTER`
        seconds fails the run then, not after the whole ``timeout`` (a retry is the better wait)."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return self.admin.list_topics(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            except KafkaException as exc:
                self.admin.poll(0)  # serves error_cb
                now = time.monotonic()
                down_since = self._reachability.down_since
                if now >= deadline or down_since is not None and now - down_since >= UNREACHABLE_AFTER:
                    raise KafkaUnavailableError(
                        f"cannot reach Kafka at {self.config['bootstrap.servers']} ({exc.args[0].str()}): check "
                        "the broker is up and the connection's bootstrap.servers; nothing was changed"
                    ) from exc

    def partitions(self, topics: Sequence[str]) -> list[TopicPartition]:
        meta = self.metadata()
        found = []
        for topic in topics:
            info = meta.topics.get(topic)
            if info is None or info.error is not None:
                raise KafkaUnavailableError(
                    f"topic {topic!r} does not exist on {self.config['bootstrap.servers']}: "
                    "check the topic name in the task (or create the topic); nothing was changed"
                )
            found += [TopicPartition(topic, p) for p in sorted(info.partitions)]
        return found

    def _list(self, specs: dict[TopicPartition, OffsetSpec]) -> dict[TopicPartition, int]:
        if not specs:
            return {}
        request = {KafkaTopicPartition(tp.topic, tp.partition): spec for tp, spec in specs.items()}
        try:
            futures = self.admin.list_offsets(
                request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=self.timeout
            )
            return {TopicPartition(k.topic, k.partition): f.result().offset for k, f in futures.items()}
        except KafkaException as exc:
            raise KafkaUnavailableError(
                f"cannot list offsets on {self.config['bootstrap.servers']} ({exc}): check the "
                "broker is up; nothing was changed"
            ) from exc

    def bounds(self, tps: list[TopicPartition]) -> dict[TopicPartition, PartitionBounds]:
        """First retained offset and last stable offset of each partition."""
        starts = self._list({tp: OffsetSpec.earliest() for tp in tps})
        ends = self._list({tp: OffsetSpec.latest() for tp in tps})
        return {tp: PartitionBounds(tp, starts[tp], ends[tp]) for tp in tps}

    def bounds_now(self, tps: list[TopicPartition]) -> dict[TopicPartition, PartitionBounds]:
        """``tps``' bounds as Kafka holds them now (a pinned client asks again: :class:`PinnedKafka`)."""
        return self.bounds(tps)

    def ask_anew(self) -> None:
        """Forget any answer kept for the run (this client keeps none: every question is asked)."""

    def offsets_for_timestamp(self, tps: list[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int]:
        """First offset at or after ``timestamp_ms`` per partition (-1 where none)."""
        return self._list({tp: OffsetSpec.for_timestamp(timestamp_ms) for tp in tps})

    def newest_timestamps(self, bounds: Mapping[TopicPartition, PartitionBounds], look_back: int = 10,
                          timeout: float = 5.0) -> dict[TopicPartition, int | None]:
        """The newest record timestamp below each partition's last stable offset, from its last
        ``look_back`` offsets (None: no record there); for messages, not for planning."""
        newest: dict[TopicPartition, int | None] = {tp: None for tp in bounds}
        wanted = {tp: b for tp, b in bounds.items() if b.end > b.log_start}
        if not wanted:
            return newest
        consumer = new_consumer(self.config, {"group.id": "airflow-eo-probe", "enable.auto.commit": False,
                                              "isolation.level": "read_committed", "enable.partition.eof": True})
        try:
            consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, max(b.log_start, b.end - look_back))
                             for tp, b in wanted.items()])
            open_ = set(wanted)
            deadline = time.monotonic() + timeout
            while open_ and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is None:
                    continue
                tp = TopicPartition(message.topic(), message.partition())
                if message.error() is not None or message.offset() >= wanted[tp].end - 1:
                    open_.discard(tp)
                if message.error() is None and message.offset() < wanted[tp].end:
                    newest[tp] = max(newest[tp] or 0, message.timestamp()[1])
        except KafkaException:
            pass  # only a message gets poorer
        finally:
            consumer.close()
        return newest

    def topic_ids(self, topics: list[str]) -> dict[str, str | None]:
        """Each topic's id (KIP-516) as the client prints it; None where the broker reports none (all
        zeros: brokers before Kafka 2.8, the embedded broker) or cannot describe topics."""
        if not topics:
            return {}
        try:
            futures = self.admin.describe_topics(TopicCollection(list(topics)), request_timeout=self.timeout)
            return {t: normal_topic_id(str(f.result().topic_id) if f.result().topic_id is not None else None)
                    for t, f in futures.items()}
        except (KafkaException, ValueError, TypeError, AttributeError) as exc:
            log.debug("topic ids not available (%s): partitions' fingerprints identify the topics", exc)
            return dict.fromkeys(topics)

    def records_at(self, offsets: Mapping[TopicPartition, int], timeout: float = 5.0) -> dict[TopicPartition, RecordStamp | None]:
        """The first record at or after each offset (read_committed; None: none there, below the
        last stable offset, within ``timeout``): what a fingerprint is compared with."""
        return self._scan({tp: (o, o + 1) for tp, o in offsets.items()}, last=False, timeout=timeout)

    def last_records(self, ends: Mapping[TopicPartition, int], look_back: int = STAMP_LOOK_BACK,
                     log_starts: Mapping[TopicPartition, int] | None = None,
                     timeout: float = 5.0) -> dict[TopicPartition, RecordStamp | None]:
        """The last record below each end, looking back ``look_back`` offsets (None: none there):
        the fingerprint a commit records (:mod:`airflow_eo.core.identity`)."""
        starts = log_starts or {}
        return self._scan({tp: (max(starts.get(tp, 0), end - look_back), end) for tp, end in ends.items()},
                          last=True, timeout=timeout)

    def _scan(self, spans: Mapping[TopicPartition, tuple[int, int]], last: bool,
              timeout: float) -> dict[TopicPartition, RecordStamp | None]:
        """One consumer over ``[lo, hi)`` of each partition: the first record there, or the last."""
        found: dict[TopicPartition, RecordStamp | None] = dict.fromkeys(spans)
        wanted = {tp: span for tp, span in spans.items() if span[1] > span[0]}
        if not wanted:
            return found
        consumer = new_consumer(self.config, {"group.id": "airflow-eo-probe", "enable.auto.commit": False,
                                              "isolation.level": "read_committed", "enable.partition.eof": True},
                                {"fetch.wait.max.ms": 10})
        try:
            consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, lo) for tp, (lo, _) in wanted.items()])
            open_, deadline = set(wanted), time.monotonic() + timeout
            # at most this many messages are due (records, and an end-of-partition event each)
            due = sum(hi - lo for lo, hi in wanted.values()) + len(wanted)
            while open_ and time.monotonic() < deadline:
                for message in consumer.consume(min(due, 10_000), 0.1):
                    tp = TopicPartition(message.topic(), message.partition())
                    if tp not in open_:
                        continue
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            open_.discard(tp)
                        continue
                    lo, hi = wanted[tp]
                    if message.offset() < hi:
                        found[tp] = RecordStamp(message.offset(), message.timestamp()[1])
                    if not last or message.offset() >= hi - 1:
                        open_.discard(tp)
        except KafkaException as exc:
            raise KafkaUnavailableError(f"cannot read from {self.config['bootstrap.servers']} ({exc}): check the "
                                        "broker is up; nothing was changed") from exc
        finally:
            consumer.close()
        return found

    def resolve_starts(
        self, position: StartingPosition, tps: list[TopicPartition],
        bounds: Mapping[TopicPartition, PartitionBounds],
    ) -> dict[TopicPartition, int]:
        """The first offset of each partition the table has never read."""
        if position.kind == "timestamp" and tps:
            found = self.offsets_for_timestamp(tps, position.timestamp_ms or 0)
            return {tp: (found[tp] if found[tp] >= 0 else bounds[tp].end) for tp in tps}
        starts = {}
        for tp in tps:
            wanted = position.explicit_offset(tp) if position.kind == "offsets" else (
                LATEST if position.kind == "latest" else EARLIEST
            )
            if wanted == EARLIEST:
                starts[tp] = bounds[tp].log_start
            elif wanted == LATEST:
                starts[tp] = bounds[tp].end
            else:
                starts[tp] = check_start(tp, wanted, bounds[tp])
        return starts

    def topics(self) -> tuple[str, ...]:
        """Every topic the cluster has (internal ones included; a pattern leaves them out)."""
        return tuple(self.metadata().topics)

    def current(self) -> "KafkaOffsets":
        """A client that answers with what Kafka holds now (this one; a pinned one gives a fresh one)."""
        return self


class PinnedKafka(KafkaOffsets):
    """One answer per question for the whole run: the tables of one read plan against the same
    metadata and bounds, so every table's batch ends at the same offsets (one plan, logged with
    each table). Safe to share between threads (the tables' steps run side by side): a question
    is asked under a lock, so it is asked once."""

    def __init__(self, config: Mapping[str, object], timeout: float = 30.0):
        super().__init__(config, timeout)
        self._metadata = None
        self._bounds: dict[TopicPartition, PartitionBounds] = {}
        self._at: dict[tuple[TopicPartition, int], int] = {}
        self._ids: dict[str, str | None] = {}
        self._current: KafkaOffsets | None = None
        self._expected: tuple[str, ...] = ()
        self._lock = threading.RLock()

    def current(self) -> KafkaOffsets:
        """What Kafka holds after the run's commits (the lags): asked once more, then pinned likewise for
        every table of the run (expecting the same topics: their bounds in one question)."""
        with self._lock:
            if self._current is None:
                current = PinnedKafka(self.config, self.timeout)
                current.expect(self._expected)
                self._current = current
            return self._current

    def ask_anew(self) -> None:
        """Forget every answer (the run's topics stay expected): the next question asks Kafka again. For a
        run that waited its turn: while it waited, another run of its tables may have committed offsets
        past the bounds pinned before, and a plan against those would read them as a topic recreated."""
        with self._lock:
            self._metadata, self._current = None, None
            self._bounds, self._at, self._ids = {}, {}, {}

    def expect(self, topics: Sequence[str]) -> None:
        """The run's topics: the first question of bounds or ids asks it of every partition of them (of those
        that exist) at once, so a run of many tables asks one question, not one per table. No I/O here."""
        self._expected = tuple(dict.fromkeys(topics))

    def _expected_topics(self) -> list[str]:
        meta = self.metadata()  # asked already by whoever asks of partitions
        return [t for t in self._expected if t in meta.topics]

    def metadata(self):
        with self._lock:
            if self._metadata is None:
                self._metadata = super().metadata()
            return self._metadata

    def bounds(self, tps: list[TopicPartition]) -> dict[TopicPartition, PartitionBounds]:
        with self._lock:
            missing = [tp for tp in tps if tp not in self._bounds]
            if missing:
                also = [tp for tp in self.partitions(self._expected_topics()) if tp not in self._bounds]
                self._bounds.update(super().bounds(list(dict.fromkeys(missing + also))))
            return {tp: self._bounds[tp] for tp in tps}

    def topic_ids(self, topics: list[str]) -> dict[str, str | None]:
        with self._lock:
            missing = [t for t in topics if t not in self._ids]
            if missing:
                also = [t for t in self._expected_topics() if t not in self._ids]
                self._ids.update(super().topic_ids(list(dict.fromkeys(missing + also))))
            return {t: self._ids[t] for t in topics}

    def bounds_now(self, tps: list[TopicPartition]) -> dict[TopicPartition, PartitionBounds]:
        """``tps``' bounds asked again (and pinned so for the rest of the run)."""
        with self._lock:
            fresh = super().bounds(tps)
            self._bounds.update(fresh)
            return fresh

    def offsets_for_timestamp(self, tps: list[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int]:
        with self._lock:
            missing = [tp for tp in tps if (tp, timestamp_ms) not in self._at]
            if missing:
                for tp, offset in super().offsets_for_timestamp(missing, timestamp_ms).items():
                    self._at[(tp, timestamp_ms)] = offset
            return {tp: self._at[(tp, timestamp_ms)] for tp in tps}
