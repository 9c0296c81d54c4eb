"""The interval ledger: which data intervals a table holds, and the boundaries they fixed.

Everything lives in ``txn`` actions, which survive checkpoints and log cleanup:

* ``airflow-eo:<ingest_id>:interval:<batch>:start`` / ``…:end`` = the batch's interval, epoch ms;
* ``airflow-eo:<ingest_id>:interval-at:<start ms>`` = the batch that committed the interval
  starting there (so a rerun of a committed interval is found with one lookup);
* ``airflow-eo:<ingest_id>:boundary:<ms>:<topic>:<partition>`` = the offset ``B(ms)`` a
  committed interval used: its neighbours read it from here instead of recomputing it;
* ``airflow-eo:<ingest_id>:intervals:min-start`` / ``…:max-end``: the committed span, so a run
  past either end of it (every scheduled run) plans with a few lookups, not a listing.

The per-partition offset ``txn`` of offset mode is kept as a high-water mark (the end of the
newest committed range), so lag, ``status`` and the consumer-group mirror work unchanged.
Which mode an ingest id uses is read from its last batch: mixing the modes is refused.

Example::

    >>> intervals = IntervalLedger(Ledger.open("/data/orders"), "orders_raw")      # doctest: +SKIP
    >>> [str(c.interval) for c in intervals.committed()]                          # doctest: +SKIP
    ['[2026-03-04T00:00:00Z, 2026-03-04T01:00:00Z)']
"""

from __future__ import annotations

from deltalake.transaction import Transaction

from dataclasses import replace
from typing import Any, Iterable, Protocol

from airflow_eo.core.errors import ConfigError
from airflow_eo.core.intervals import (
    CommittedInterval, Recorded, interval_state, neighbour_times, overlapping, start_boundaries,
)
from airflow_eo.core.planning import BatchPlan, CommitCheck
from airflow_eo.core.offsets import Interval, OffsetRange, TopicPartition
from airflow_eo.table.app_ids import boundary_app_id, interval_app_id, interval_at_app_id, partition_app_id, span_app_id
from airflow_eo.table.metadata import CommitKind


class Snapshot(Protocol):
    """What the interval ledger reads of a :class:`airflow_eo.table.ledger.Ledger` (one snapshot of
    the table's log); the ledger answers for interval plans through this module, so it is named here
    by what it offers, not imported."""

    table: Any  # the DeltaTable, None before the table exists
    table_uri: str

    def txn(self, app_id: str) -> int | None: ...
    def last_batch(self, ingest_id: str) -> int: ...
    def committed_offsets(self, ingest_id: str, partitions: Iterable[TopicPartition]) -> dict: ...
    def find_batch(self, ingest_id: str, *, attempt_id: str | None = None, run_key: str | None = None,
                   batch: int | None = None, since_version: int = 0, operation: CommitKind | None = None) -> Any: ...


class IntervalLedger:
    """The interval side of one ledger snapshot (see the module doc)."""

    def __init__(self, ledger: Snapshot, ingest_id: str):
        self.ledger, self.ingest_id = ledger, ingest_id
        self._committed: list[CommittedInterval] | None = None

    def _txn(self, app_id: str) -> int | None:
        return self.ledger.txn(app_id)

    def is_interval_table(self) -> bool | None:
        """True / False for an ingest whose batches are / are not intervals; None before any batch."""
        last = self.ledger.last_batch(self.ingest_id)
        if last == 0:
            return None
        return self._txn(interval_app_id(self.ingest_id, last, "start")) is not None

    def check_mode(self, interval_mode: bool) -> None:
        """Refuse to mix offset-incremental and interval batches on one ingest id."""
        current = self.is_interval_table()
        if current is None or current == interval_mode:
            return
        have, want = ("interval", "offset") if current else ("offset", "interval")
        raise ConfigError(
            f"ingest_id {self.ingest_id!r} of {self.ledger.table_uri} is {have}-keyed; this run asks for "
            f"{want} mode: one ingest id keeps one mode (mode='{have}' here, or another ingest_id and "
            "table for the other mode); nothing was changed")

    def committed(self) -> list[CommittedInterval]:
        """Every committed interval, in batch order (two lookups per batch, in memory)."""
        if self._committed is None:
            found = []
            for batch in range(1, self.ledger.last_batch(self.ingest_id) + 1):
                start = self._txn(interval_app_id(self.ingest_id, batch, "start"))
                end = self._txn(interval_app_id(self.ingest_id, batch, "end"))
                if start is not None and end is not None:
                    found.append(CommittedInterval(batch, Interval(start, end)))
            self._committed = found
        return self._committed

    def check_merge_order(self, interval: Interval) -> None:
        """A merge table (write_mode="merge") takes its intervals in time order: a batch's changes
        replace the table's rows, so an interval committed after a later one would put older
        values over newer ones."""
        span = self.span()
        if span is not None and interval.start_ms < span[1]:
            raise ConfigError(
                f"interval {interval} of {self.ledger.table_uri} starts before the end of its committed intervals "
                f"({Interval(*span)}): a merge table applies changes in time order, so its intervals commit oldest "
                "first; backfill the missing intervals in order (or into a new table); nothing was changed")

    def span(self) -> tuple[int, int] | None:
        """(earliest start, latest end) of the committed intervals; None before the first."""
        low, high = self._txn(span_app_id(self.ingest_id, "min-start")), self._txn(span_app_id(self.ingest_id, "max-end"))
        return None if low is None or high is None else (low, high)

    def around(self, interval: Interval) -> tuple[int | None, int | None, CommittedInterval | None]:
        """The nearest recorded boundary times before and after ``interval``, and a committed
        interval it overlaps. A run at either end of the committed span (scheduled runs,
        backfills in order) needs no listing; one in between lists the intervals."""
        span = self.span()
        if span is None:
            return None, None, None
        if interval.start_ms >= span[1]:
            return span[1], None, None
        if interval.end_ms <= span[0]:
            return None, span[0], None
        committed = self.committed()
        return (*neighbour_times(interval, committed), overlapping(interval, committed))

    def state_of(self, plan: BatchPlan) -> CommitCheck:
        """Is the interval plan committable, committed, or overtaken on this snapshot
        (:func:`airflow_eo.core.intervals.interval_state`; what :meth:`airflow_eo.table.ledger.Ledger.state_of` answers for it)."""
        iv = plan.interval
        assert iv is not None, "the state of an interval plan"
        held = self.holding(iv)
        if held is not None:
            return interval_state(plan, held)
        before, after, clash = self.around(iv)
        recorded = {r.tp: Recorded(self.boundary(iv.start_ms, r.tp), self.boundary(iv.end_ms, r.tp),
                                   self.boundary(before, r.tp), self.boundary(after, r.tp)) for r in plan.ranges}
        return interval_state(plan, None, clash is not None, recorded)

    def holding(self, interval: Interval) -> CommittedInterval | None:
        """The committed interval that starts where ``interval`` does (its end may differ), or None."""
        batch = self.batch_at(interval.start_ms)
        end = self.end_of(batch) if batch is not None else None
        return CommittedInterval(batch, Interval(interval.start_ms, end)) if batch is not None and end is not None \
            else None

    def committed_plan(self, plan: BatchPlan) -> BatchPlan:
        """``plan`` as the table holds its interval: under the batch number it was committed with (a
        rebase may have renumbered it; another run may have committed the interval) and with the
        ranges that commit recorded (from its boundaries when the log no longer holds it)."""
        iv = plan.interval
        held = self.holding(iv) if iv is not None else None
        if held is None or held.interval != iv:
            return plan
        record = self.ledger.find_batch(self.ingest_id, batch=held.batch, operation=CommitKind.BATCH)
        if record is not None:
            return replace(plan, batch=held.batch, ranges=record.meta.ranges, skipped=record.meta.skipped)
        if held.batch == plan.batch:
            return plan
        ranges = self.ranges_of(held, [r.tp for r in plan.ranges])
        return replace(plan, batch=held.batch, skipped=(),
                       ranges=tuple(OffsetRange(tp.topic, tp.partition, *r) for tp, r in sorted(ranges.items())))

    def batch_at(self, start_ms: int) -> int | None:
        """The batch that committed the interval starting at ``start_ms`` (None: none)."""
        return self._txn(interval_at_app_id(self.ingest_id, start_ms))

    def end_of(self, batch: int) -> int | None:
        """The end of the interval ``batch`` committed (None: not an interval batch)."""
        return self._txn(interval_app_id(self.ingest_id, batch, "end"))

    def boundary(self, at_ms: int | None, tp: TopicPartition) -> int | None:
        """The offset ``B(at_ms)`` of ``tp`` a committed interval fixed (None: not recorded)."""
        return None if at_ms is None else self._txn(boundary_app_id(self.ingest_id, at_ms, tp))

    def ranges_of(self, committed: CommittedInterval, partitions) -> dict[TopicPartition, tuple[int, int]]:
        """The offsets ``[B(T0), B(T1))`` an interval owns, from its recorded boundaries."""
        out = {}
        for tp in partitions:
            start, end = self.boundary(committed.interval.start_ms, tp), self.boundary(committed.interval.end_ms, tp)
            if start is not None and end is not None:
                out[tp] = (start, end)
        return out

    def transactions(self, plan: BatchPlan) -> list[Transaction]:
        """What an interval batch's commit sets besides the batch counter: the interval, its
        boundaries, and each partition's high-water offset."""
        iv, ingest_id = plan.interval, self.ingest_id
        assert iv is not None, "the transactions of an interval batch"
        txns = [Transaction(interval_app_id(ingest_id, plan.batch, "start"), iv.start_ms),
                Transaction(interval_app_id(ingest_id, plan.batch, "end"), iv.end_ms),
                Transaction(interval_at_app_id(ingest_id, iv.start_ms), plan.batch)]
        span = self.span() or (iv.start_ms, iv.end_ms)
        txns += [Transaction(span_app_id(ingest_id, "min-start"), min(span[0], iv.start_ms)),
                 Transaction(span_app_id(ingest_id, "max-end"), max(span[1], iv.end_ms))]
        starts = start_boundaries(plan)
        high = self.ledger.committed_offsets(ingest_id, [r.tp for r in plan.ranges])
        for r in plan.ranges:
            txns += [Transaction(boundary_app_id(ingest_id, iv.start_ms, r.tp), starts[r.tp]),
                     Transaction(boundary_app_id(ingest_id, iv.end_ms, r.tp), r.end),
                     Transaction(partition_app_id(ingest_id, r.tp), max(high[r.tp] or 0, r.end))]
        return txns
