"""Planners: the I/O half of step 1 — gather what the table and Kafka hold, let the core decide.

Two ways to plan plug into the one place the ingestion loop plans
(:meth:`airflow_eo.loop.ingest.Ingestion.plan`):

* :class:`OffsetPlanner` (the default, ``mode="offsets"``): everything new since the last
  commit, up to Kafka's last stable offsets (:func:`airflow_eo.core.planning.plan_batch`);
* :class:`IntervalPlanner` (``mode="interval"``): the records of one data interval, by Kafka
  timestamp, with boundaries a committed neighbour fixed read from the table
  (:func:`airflow_eo.core.intervals.plan_interval`). A committed interval is answered with its
  :class:`~airflow_eo.core.intervals.CommittedInterval`: a rerun is a verified no-op. Its
  :meth:`IntervalPlanner.closing` says whether the interval may be planned yet, by the rule the
  plan applies: what a deferred run waits on (:mod:`airflow_eo.triggers.interval_closed`).

Example::

    >>> planner = IntervalPlanner(config, interval_of("2026-03-04T00:00Z", "2026-03-04T01:00Z"))  # doctest: +SKIP
    >>> planner.plan(RunIdentity("r1"), Ledger.open(config.table_uri), KafkaOffsets(config.kafka_config))  # doctest: +SKIP
    BatchPlan(ingest_id='orders_raw', batch=4, ranges=(...), interval=Interval(...), ...)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from airflow_eo.core.errors import ConfigError
from airflow_eo.core.intervals import CommittedInterval, PartitionFacts, plan_interval, waiting
from airflow_eo.kafka import KafkaOffsets
from airflow_eo.core.planning import BatchPlan, partitions_without_offsets, plan_batch
from airflow_eo.core.offsets import Interval, RunIdentity, TopicPartition
from airflow_eo.spec import Mode
from airflow_eo.table.intervals import IntervalLedger
from airflow_eo.table.ledger import Ledger

OFFSETS, INTERVAL = Mode.OFFSETS, Mode.INTERVAL


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def shrunk(partitions: list[TopicPartition]) -> list[TopicPartition]:
    """The partition after the last of each topic: a committed offset there means the topic
    was recreated with fewer partitions."""
    last: dict[str, int] = {}
    for tp in partitions:
        last[tp.topic] = max(last.get(tp.topic, -1), tp.partition)
    return [TopicPartition(t, p + 1) for t, p in last.items()]


class OffsetPlanner:
    """The next batch: ``[committed, last stable offset)`` per partition, capped fairly.
    ``config`` is the ingest's :class:`airflow_eo.loop.config.IngestConfig` (its options typed by the spec)."""

    def __init__(self, config):
        self.config = config

    def plan(self, run: RunIdentity, ledger: Ledger, kafka: KafkaOffsets) -> BatchPlan:
        c = self.config
        IntervalLedger(ledger, c.ingest_id).check_mode(interval_mode=False)
        partitions = kafka.partitions(c.topics)
        bounds = kafka.bounds(partitions)
        committed = ledger.committed_offsets(c.ingest_id, partitions + shrunk(partitions))
        committed = {tp: v for tp, v in committed.items() if v is not None or tp in bounds}
        new = partitions_without_offsets(committed, bounds)
        new_starts = kafka.resolve_starts(c.starting_offsets, new, bounds)
        return plan_batch(
            ingest_id=c.ingest_id, batch=ledger.last_batch(c.ingest_id) + 1,
            committed=committed, bounds=bounds, new_starts=new_starts,
            max_records=c.max_records_per_run, on_data_loss=c.on_data_loss, run=run, planned_at=_now(),
        )


@dataclass(frozen=True)
class IntervalClosing:
    """Whether an interval may be planned now (:func:`airflow_eo.core.intervals.waiting`, the rule the
    plan applies): ``open`` names the partitions that may still receive records of it; none
    are open after ``closes_by_ms`` (``close_after`` past its end); ``committed_batch``: the
    interval is already in the table (a rerun, nothing to wait for)."""

    interval: Interval
    open: tuple[TopicPartition, ...]
    closes_by_ms: int
    committed_batch: int | None = None

    @property
    def closed(self) -> bool:
        return not self.open


class IntervalPlanner:
    """The batch that owns ``interval``'s records (see :mod:`airflow_eo.core.intervals`)."""

    def __init__(self, config, interval: Interval):
        self.config, self.interval = config, interval

    def facts(self, ledger: Ledger, kafka: KafkaOffsets) -> "dict[TopicPartition, PartitionFacts] | CommittedInterval":
        """What the table and Kafka say of each partition's boundaries (or the committed interval)."""
        c, iv = self.config, self.interval
        intervals = IntervalLedger(ledger, c.ingest_id)
        intervals.check_mode(interval_mode=True)
        batch = intervals.batch_at(iv.start_ms)
        if batch is not None and intervals.end_of(batch) == iv.end_ms:
            return CommittedInterval(batch, iv)
        before, after, clash = intervals.around(iv)
        if clash is not None:
            raise ConfigError(
                f"interval {iv} overlaps interval {clash.interval} that batch {clash.batch} of {c.ingest_id} committed: "
                "intervals of one ingest must not overlap (keep the DAG's schedule, or use another "
                "ingest_id and table); nothing was committed")
        partitions = kafka.partitions(c.topics)
        bounds = kafka.bounds(partitions)
        found_start = kafka.offsets_for_timestamp(partitions, iv.start_ms)
        found_end = kafka.offsets_for_timestamp(partitions, iv.end_ms)
        return {
            tp: PartitionFacts(
                bounds[tp], recorded_start=intervals.boundary(iv.start_ms, tp),
                recorded_end=intervals.boundary(iv.end_ms, tp), found_start=found_start[tp],
                found_end=found_end[tp], floor=intervals.boundary(before, tp), ceiling=intervals.boundary(after, tp))
            for tp in partitions
        }

    def closing(self, ledger: Ledger, kafka: KafkaOffsets, now_ms: int | None = None) -> IntervalClosing:
        """Is the interval closed now? What a deferred run waits on (:mod:`airflow_eo.triggers.interval_closed`)."""
        iv, close_after_ms = self.interval, int(self.config.close_after * 1000)
        closes_by = iv.end_ms + close_after_ms
        facts = self.facts(ledger, kafka)
        if isinstance(facts, CommittedInterval):
            return IntervalClosing(iv, (), closes_by, committed_batch=facts.batch)
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        return IntervalClosing(iv, self._open(facts, now_ms), closes_by)

    def _open(self, facts: dict[TopicPartition, PartitionFacts], now_ms: int) -> tuple[TopicPartition, ...]:
        close_after_ms = int(self.config.close_after * 1000)
        return tuple(tp for tp, f in sorted(facts.items()) if waiting(f, self.interval, now_ms, close_after_ms))

    def plan(self, run: RunIdentity, ledger: Ledger, kafka: KafkaOffsets) -> "BatchPlan | CommittedInterval":
        c, iv = self.config, self.interval
        facts = self.facts(ledger, kafka)
        if isinstance(facts, CommittedInterval):
            return facts
        now_ms, close_after_ms = int(time.time() * 1000), int(c.close_after * 1000)
        open_ = self._open(facts, now_ms)
        if open_:  # the plan will say the interval is not closed: with how far that partition got
            newest = kafka.newest_timestamps({tp: facts[tp].bounds for tp in open_[:1]})
            facts.update({tp: replace(facts[tp], newest_ms=ms) for tp, ms in newest.items()})
        return plan_interval(
            ingest_id=c.ingest_id, batch=ledger.last_batch(c.ingest_id) + 1, interval=iv, facts=facts,
            now_ms=now_ms, close_after_ms=close_after_ms, on_data_loss=c.on_data_loss, run=run, planned_at=_now())
