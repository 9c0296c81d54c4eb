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
from airflow_eo.core.identity import Recreation, recreations, stamped
from airflow_eo.core.intervals import CommittedInterval, PartitionFacts, plan_interval, waiting
from airflow_eo.kafka import KafkaOffsets
from airflow_eo.core.planning import BatchPlan, partitions_without_offsets, plan_batch
from airflow_eo.core.offsets import Interval, PartitionBounds, RunIdentity, TopicPartition
from airflow_eo.spec import Mode
from airflow_eo.table.intervals import IntervalLedger
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.metadata import CommitKind

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


def vanished(ledger: Ledger, ingest_id: str, committed: dict[TopicPartition, int | None],
             bounds: dict[TopicPartition, PartitionBounds]) -> dict[TopicPartition, int | None]:
    """``committed`` with every partition beyond Kafka's that the table holds an offset of (a topic
    recreated with fewer partitions; partitions are numbered from 0 without gaps)."""
    out = dict(committed)
    for tp in [tp for tp in committed if tp not in bounds and committed[tp]]:
        nxt = TopicPartition(tp.topic, tp.partition + 1)
        while (offset := ledger.committed_offsets(ingest_id, [nxt])[nxt]) is not None:
            out[nxt] = offset
            nxt = TopicPartition(tp.topic, nxt.partition + 1)
    return out


class TopicIdentities:
    """Step 1's identity half (:mod:`airflow_eo.core.identity`): what the table recorded of its topics
    against what Kafka says now, and what a new plan records. Topic ids come from one describe call
    per plan; where Kafka reports none, fingerprints are read from Kafka only for the topics the plan
    would read something from."""

    def __init__(self, ledger: Ledger, kafka: KafkaOffsets, ingest_id: str, topics: tuple[str, ...]):
        self.ledger, self.kafka, self.ingest_id = ledger, kafka, ingest_id
        self.ids = kafka.topic_ids(list(topics))

    def recreated(self, committed: dict[TopicPartition, int | None],
                  bounds: dict[TopicPartition, PartitionBounds]) -> list[Recreation]:
        """The topics the table read whose identity changed."""
        ledger, ingest = self.ledger, self.ingest_id
        topics = sorted({tp.topic for tp, o in committed.items() if o is not None})
        if not topics:
            return []
        marks = {t: ledger.topic_mark(ingest, t) for t in topics}
        by_id = {t for t in topics if self.ids.get(t) is not None and marks[t]}
        stamps = ledger.stamps(ingest, {tp: o for tp, o in committed.items() if tp.topic not in by_id})
        reading = {tp.topic for tp, b in bounds.items() if b.end > max(b.log_start, committed.get(tp) or 0)}
        check = stamped(committed, bounds, stamps, reading)
        found = self.kafka.records_at(check) if check else {}
        recorded: dict[str, str] = {}
        for _ in range(2):  # a changed id is named whole in the message: read from the last batch's commit
            changed = recreations(committed, bounds, kafka_ids=self.ids, marks=marks, stamps=stamps, found=found,
                                  recorded_ids=recorded)
            if recorded or not any(r.topic in by_id for r in changed):
                return changed
            last = ledger.find_batch(ingest, batch=ledger.last_batch(ingest), operation=CommitKind.BATCH)
            recorded = dict(last.meta.topic_ids) if last else {"": ""}
        return changed

    def recorded(self, plan: BatchPlan, bounds: dict[TopicPartition, PartitionBounds]) -> BatchPlan:
        """``plan`` with what identifies its topics: their ids, else the fingerprint of each partition
        whose offset it moves (the last record below its end, read now, while the topic is the one
        it was planned from)."""
        ids = tuple((t, i) for t, i in sorted(self.ids.items()) if i is not None)
        with_id, expected = {t for t, _ in ids}, plan.expected_committed
        moved = {r.tp: r.end for r in plan.ranges if r.tp.topic not in with_id and r.end != expected.get(r.tp)}
        stamps = self.kafka.last_records(moved, log_starts={tp: bounds[tp].log_start for tp in moved}) if moved else {}
        return replace(plan, topic_ids=ids, stamps=tuple(sorted(stamps.items())))


class OffsetPlanner:
    """The next batch: ``[committed, last stable offset)`` per partition, capped fairly.
    ``config`` is the ingest's :class:`airflow_eo.loop.config.IngestConfig` (its options typed by the spec).

    ``starting_offsets`` places the partitions of the table's first batch; a partition that appears
    later (added to the topic, or a topic new to the ingest) starts at its log start, unless the user
    named it (:meth:`~airflow_eo.core.planning.StartingPosition.after_first_batch`)."""

    def __init__(self, config):
        self.config = config

    def plan(self, run: RunIdentity, ledger: Ledger, kafka: KafkaOffsets) -> BatchPlan:
        c = self.config
        IntervalLedger(ledger, c.ingest_id).check_mode(interval_mode=False)
        partitions = kafka.partitions(c.topics)
        bounds = kafka.bounds(partitions)
        committed = ledger.committed_offsets(c.ingest_id, partitions + shrunk(partitions))
        committed = vanished(ledger, c.ingest_id, {tp: v for tp, v in committed.items()
                                                   if v is not None or tp in bounds}, bounds)
        passed = [tp for tp, b in bounds.items() if (committed.get(tp) or 0) > b.end]
        if passed:  # another run committed past the run's bounds after they were asked (a run of several
            # tables that holds no lease plans them side by side): judged against what Kafka holds now
            bounds = {**bounds, **kafka.bounds_now(passed)}
        last = ledger.last_batch(c.ingest_id)
        source, planning = c.spec.source, c.spec.planning
        position = source.starting_offsets if last == 0 else source.starting_offsets.after_first_batch()
        new = partitions_without_offsets(committed, bounds)
        new_starts = kafka.resolve_starts(position, new, bounds)
        identities = TopicIdentities(ledger, kafka, c.ingest_id, c.topics)
        plan = plan_batch(
            ingest_id=c.ingest_id, batch=last + 1,
            committed=committed, bounds=bounds, new_starts=new_starts,
            max_records=planning.max_records_per_run, on_data_loss=source.on_data_loss, run=run, planned_at=_now(),
            recreated=identities.recreated(committed, bounds) if last else (),
            on_topic_recreated=source.on_topic_recreated,
        )
        return identities.recorded(plan, bounds) if not plan.is_empty else plan


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
        iv, close_after_ms = self.interval, int(self.config.spec.planning.close_after * 1000)
        closes_by = iv.end_ms + close_after_ms
        facts = self.facts(ledger, kafka)
        if isinstance(facts, CommittedInterval):
            return IntervalClosing(iv, (), closes_by, committed_batch=facts.batch)
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        return IntervalClosing(iv, self._open(facts, now_ms), closes_by)

    def _open(self, facts: dict[TopicPartition, PartitionFacts], now_ms: int) -> tuple[TopicPartition, ...]:
        close_after_ms = int(self.config.spec.planning.close_after * 1000)
        return tuple(tp for tp, f in sorted(facts.items()) if waiting(f, self.interval, now_ms, close_after_ms))

    def plan(self, run: RunIdentity, ledger: Ledger, kafka: KafkaOffsets) -> "BatchPlan | CommittedInterval":
        c, iv = self.config, self.interval
        facts = self.facts(ledger, kafka)
        if isinstance(facts, CommittedInterval):
            return facts
        now_ms, close_after_ms = int(time.time() * 1000), int(c.spec.planning.close_after * 1000)
        open_ = self._open(facts, now_ms)
        if open_:  # the plan will say the interval is not closed: with how far that partition got
            newest = kafka.newest_timestamps({tp: facts[tp].bounds for tp in open_[:1]})
            facts.update({tp: replace(facts[tp], newest_ms=ms) for tp, ms in newest.items()})
        return plan_interval(
            ingest_id=c.ingest_id, batch=ledger.last_batch(c.ingest_id) + 1, interval=iv, facts=facts,
            now_ms=now_ms, close_after_ms=close_after_ms, on_data_loss=c.spec.source.on_data_loss, run=run,
            planned_at=_now())
