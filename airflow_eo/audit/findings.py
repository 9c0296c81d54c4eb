"""The audit's reconciliation core: what the ledger, the table and Kafka say of each offset, compared.

Pure: it gets the committed ranges of the batches (from the Delta log), the offsets of the
table's rows and dead letters, and the offsets a ``read_committed`` consumer delivered, all as
sorted numpy arrays per topic-partition, and returns typed :class:`Finding` s. Drift is
:data:`DRIFT`; the other kinds say what was accounted for (skips, dead letters, dropped
duplicates) or could not be checked (Kafka's retention deleted it).

Example::

    >>> import numpy as np
    >>> tp = TopicPartition("orders", 0)
    >>> b = BatchRanges(1, 1, (OffsetRange("orders", 0, 0, 4),))
    >>> scope = PartitionScope(tp, log_start=0, audited=((b, OffsetRange("orders", 0, 0, 4)),))
    >>> found = reconcile_partition(scope, kafka=np.array([0, 1, 2, 3]), table=np.array([0, 1, 1, 3]),
    ...                             dead=np.array([], dtype=np.int64), committed=[(0, 4)])
    >>> [(f.kind.value, f.offsets) for f in found.findings], found.missing
    ([('duplicated', (1,))], {1: (2,)})
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

from airflow_eo.core.offsets import OffsetRange, SkippedRange, TopicPartition

# offsets listed per finding; the count is always exact
MAX_LISTED = 50


class FindingKind(str, enum.Enum):
    LOST = "lost"  # Kafka delivered it in a committed range, it is neither in the table nor a dead letter
    DUPLICATED = "duplicated"  # more than one row of the table has this offset
    STRAY = "stray"  # a row whose offset is outside every committed range, or that Kafka never delivers
    OVERLAP = "overlap"  # a batch's range starts before the previous batch's range ended
    GAP = "gap"  # offsets between two batches that no batch committed and none recorded as skipped
    TXN_MISMATCH = "txn_mismatch"  # the table's txn offset is not the end of its last committed range
    UNVERIFIABLE = "unverifiable"  # Kafka no longer holds these offsets of a committed range
    SKIPPED = "skipped"  # a gap recorded by on_data_loss="skip"
    DEAD_LETTERED = "dead_lettered"  # offsets found in the dead-letter table
    DEDUPLICATED = "deduplicated"  # offsets missing from the table within the batch's recorded dropped duplicates
    ROW_COUNT = "row_count"  # merge mode: the table's rows differ from what its merge commits recorded
    DELETED = "deleted"  # in the table once, then deleted by a later commit (another engine's deletion vector)

    def __str__(self) -> str:
        return self.value


DRIFT = frozenset({FindingKind.LOST, FindingKind.DUPLICATED, FindingKind.STRAY, FindingKind.OVERLAP,
                   FindingKind.GAP, FindingKind.TXN_MISMATCH, FindingKind.ROW_COUNT})

# where a finding about the whole table (not one partition) is filed
WHOLE_TABLE = TopicPartition("(table)", -1)


@dataclass(frozen=True)
class Finding:
    """One kind of result on one topic-partition: ``count`` offsets (or rows), the first
    :data:`MAX_LISTED` of them in ``offsets``, or the span ``[start, end)`` they make up."""

    kind: FindingKind
    tp: TopicPartition
    count: int
    offsets: tuple[int, ...] = ()
    start: int | None = None
    end: int | None = None
    batch: int | None = None
    detail: str = ""

    @property
    def drift(self) -> bool:
        return self.kind in DRIFT

    def __str__(self) -> str:
        where = f" {self.start}..{self.end}" if self.start is not None else ""
        listed = f" at {', '.join(map(str, self.offsets))}{' …' if self.count > len(self.offsets) else ''}" \
            if self.offsets else ""
        batch = f" (batch {self.batch})" if self.batch is not None else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.tp} {self.kind.value} {self.count}{where}{listed}{batch}{detail}"

    def to_dict(self) -> dict:
        return {"kind": self.kind.value, "topic": self.tp.topic, "partition": self.tp.partition,
                "count": self.count, "offsets": list(self.offsets), "start": self.start, "end": self.end,
                "batch": self.batch, "detail": self.detail}


@dataclass(frozen=True)
class BatchRanges:
    """What the ledger says of one batch's newest data commit (an ingest, or the reprocess
    that replaced it): its ranges, the gaps it skipped and the duplicates it dropped."""

    batch: int
    version: int
    ranges: tuple[OffsetRange, ...]
    skipped: tuple[SkippedRange, ...] = ()
    dropped_duplicates: int = 0
    duplicates_to_dead_letters: bool = False
    write_mode: str = "append"  # how the batch wrote its rows (BatchMetadata; "merge" keeps one row per key)


def _listed(values: np.ndarray) -> tuple[int, ...]:
    return tuple(int(v) for v in values[:MAX_LISTED])


def _spans(offsets: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged half-open spans."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(o for o in offsets if o[1] > o[0]):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _uncovered(start: int, end: int, covers: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``[start, end)`` outside the merged spans ``covers``."""
    out, at = [], start
    for s, e in covers:
        if e <= at or s >= end:
            continue
        if s > at:
            out.append((at, s))
        at = max(at, e)
    if at < end:
        out.append((at, end))
    return out


def check_tiling(batches: Sequence[BatchRanges], txn: Mapping[TopicPartition, int | None]) -> list[Finding]:
    """Per partition, the batches' ranges in batch order must follow each other without gap
    (except skips they recorded) or overlap, and end at the table's ``txn`` offset."""
    findings: list[Finding] = []
    skipped_by_tp: dict[TopicPartition, list[tuple[int, int]]] = {}
    for b in batches:
        for s in b.skipped:
            tp = TopicPartition(s.topic, s.partition)
            skipped_by_tp.setdefault(tp, []).append((s.start, s.end))
            findings.append(Finding(FindingKind.SKIPPED, tp, s.end - s.start, start=s.start, end=s.end, batch=b.batch,
                                    detail=s.reason))
    ends: dict[TopicPartition, int] = {}
    for b in sorted(batches, key=lambda b: b.batch):
        for r in sorted(b.ranges):
            prev = ends.get(r.tp)
            if prev is not None and r.start > prev:
                for lo, hi in _uncovered(prev, r.start, _spans(skipped_by_tp.get(r.tp, []))):
                    findings.append(Finding(FindingKind.GAP, r.tp, hi - lo, start=lo, end=hi, batch=b.batch,
                                            detail="no batch committed these offsets and none recorded a skip"))
            elif prev is not None and r.start < prev:
                findings.append(Finding(FindingKind.OVERLAP, r.tp, min(prev, r.end) - r.start, start=r.start,
                                        end=min(prev, r.end), batch=b.batch,
                                        detail=f"the batch's range {r.start}..{r.end} starts before {prev}, where "
                                               "the previous batch ended"))
            ends[r.tp] = r.end if prev is None else max(prev, r.end)
    for tp, end in sorted(ends.items()):
        committed = txn.get(tp)
        if committed != end:
            findings.append(Finding(FindingKind.TXN_MISMATCH, tp, abs((committed or 0) - end), start=min(end, committed or 0),
                                    end=max(end, committed or 0),
                                    detail=f"the table's txn offset is {committed}, its last committed range ends at {end}"))
    return findings


@dataclass(frozen=True)
class PartitionScope:
    """One partition's audited ranges (with their batch) and the first offset Kafka still holds."""

    tp: TopicPartition
    log_start: int
    audited: tuple[tuple[BatchRanges, OffsetRange], ...]

    @property
    def lowest(self) -> int:
        """The first offset audited: table rows from here on are compared."""
        return min((r.start for _, r in self.audited), default=0)

    def checked(self) -> list[tuple[BatchRanges, int, int]]:
        """The audited ranges clipped to what Kafka holds (empty parts dropped)."""
        return [(b, max(r.start, self.log_start), r.end) for b, r in self.audited if r.end > max(r.start, self.log_start)]


@dataclass(frozen=True)
class PartitionResult:
    """A partition's findings, and the offsets it misses per batch (decided by :func:`account_batches`)."""

    tp: TopicPartition
    findings: tuple[Finding, ...]
    missing: dict[int, tuple[int, ...]] = field(default_factory=dict)
    missing_counts: dict[int, int] = field(default_factory=dict)
    checked_offsets: int = 0
    rows_read: int = 0
    delivered: dict[int, int] = field(default_factory=dict)  # per batch: records Kafka delivered in its checked ranges


def _in_spans(values: np.ndarray, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """Boolean mask: which of ``values`` lie in one of the sorted, merged ``spans``."""
    if not spans or values.size == 0:
        return np.zeros(values.shape, dtype=bool)
    starts = np.array([s for s, _ in spans], dtype=np.int64)
    ends = np.array([e for _, e in spans], dtype=np.int64)
    at = np.searchsorted(starts, values, side="right") - 1
    return (at >= 0) & (values < ends[np.clip(at, 0, None)])


# -- slices: one partition compared a part at a time, so memory follows the slice, not the table --

@dataclass(frozen=True)
class SliceSpec:
    """What one slice of a partition compares: the table's rows at offsets ``[lo, hi)`` (``hi``
    None: every row from ``lo`` on, the partition's last slice), and Kafka's records in the
    audited ranges within it (``checked``: ``(batch, start, end)``, clipped to the slice and to
    what Kafka holds); ``committed``: every batch's ranges within the slice (a row outside them
    is stray)."""

    tp: TopicPartition
    lo: int
    hi: int | None
    checked: tuple[tuple[int, int, int], ...] = ()
    committed: tuple[tuple[int, int], ...] = ()

    @property
    def kafka_spans(self) -> list[tuple[int, int]]:
        """The offsets to ask Kafka for, merged."""
        return _spans((s, e) for _, s, e in self.checked)

    @property
    def checked_offsets(self) -> int:
        return sum(e - s for _, s, e in self.checked)

    def to_dict(self) -> dict:
        return {"topic": self.tp.topic, "partition": self.tp.partition, "lo": self.lo, "hi": self.hi,
                "checked": [list(c) for c in self.checked], "committed": [list(c) for c in self.committed]}

    @classmethod
    def from_dict(cls, raw: dict) -> "SliceSpec":
        return cls(TopicPartition(raw["topic"], int(raw["partition"])), int(raw["lo"]),
                   None if raw["hi"] is None else int(raw["hi"]),
                   tuple((int(b), int(s), int(e)) for b, s, e in raw["checked"]),
                   tuple((int(s), int(e)) for s, e in raw["committed"]))


def _clip(spans: Iterable[tuple[int, int]], lo: int, hi: int | None) -> list[tuple[int, int]]:
    top = hi if hi is not None else None
    out = []
    for s, e in spans:
        s, e = max(s, lo), e if top is None else min(e, top)
        if e > s:
            out.append((s, e))
    return out


def plan_slices(scope: PartitionScope, committed: Sequence[tuple[int, int]], slice_offsets: int,
                table_upper: int | None = None) -> list[SliceSpec]:
    """``scope``'s partition cut into slices of ``slice_offsets`` offsets from its lowest audited
    offset up to the last audited offset or ``table_upper`` (the highest offset the table's file
    statistics admit), whichever is higher; the last slice is open-ended, so a row beyond every
    statistic (or in a file without any) is still compared.

        >>> tp = TopicPartition("t", 0)
        >>> b = BatchRanges(1, 1, (OffsetRange("t", 0, 0, 25),))
        >>> scope = PartitionScope(tp, 0, ((b, b.ranges[0]),))
        >>> [(s.lo, s.hi, s.checked) for s in plan_slices(scope, [(0, 25)], 10)]
        [(0, 10, ((1, 0, 10),)), (10, 20, ((1, 10, 20),)), (20, None, ((1, 20, 25),))]
    """
    if slice_offsets < 1:
        raise ValueError(f"slice_offsets must be positive, not {slice_offsets}")
    checked = scope.checked()
    lo = scope.lowest
    top = max([e for _, _, e in checked] + [lo + 1] + ([table_upper + 1] if table_upper is not None else []))
    merged = _spans(committed)
    out = []
    while True:
        hi = lo + slice_offsets if lo + slice_offsets < top else None
        out.append(SliceSpec(scope.tp, lo, hi,
                             tuple((b.batch, s, e) for b, s0, e0 in checked for s, e in _clip([(s0, e0)], lo, hi)),
                             tuple(_clip(merged, lo, hi))))
        if hi is None:
            return out
        lo = hi


@dataclass(frozen=True)
class Listed:
    """A count, and the first :data:`MAX_LISTED` offsets it covers (slices in offset order)."""

    count: int = 0
    offsets: tuple[int, ...] = ()

    @classmethod
    def of(cls, values: np.ndarray, count: int | None = None) -> "Listed":
        return cls(int(values.size) if count is None else count, _listed(values))

    def plus(self, other: "Listed") -> "Listed":
        return Listed(self.count + other.count, (self.offsets + other.offsets)[:MAX_LISTED])


@dataclass(frozen=True)
class SliceResult:
    """What one slice found: counts with the first offsets listed, small whatever the slice's size
    (it travels back from a Spark task as JSON)."""

    spec: SliceSpec
    duplicated_rows: Listed = Listed()  # count: rows beyond the first per offset; offsets: those offsets
    duplicated_offsets: int = 0
    stray: Listed = Listed()
    dead_lettered: Listed = Listed()
    missing: dict[int, Listed] = field(default_factory=dict)  # per batch
    delivered: dict[int, int] = field(default_factory=dict)  # per batch
    rows_read: int = 0
    deleted: dict[str, Listed] = field(default_factory=dict)  # by the commit that deleted them

    def to_dict(self) -> dict:
        def listed(x: Listed) -> list:
            return [x.count, list(x.offsets)]
        return {"spec": self.spec.to_dict(), "duplicated_rows": listed(self.duplicated_rows),
                "duplicated_offsets": self.duplicated_offsets, "stray": listed(self.stray),
                "dead_lettered": listed(self.dead_lettered),
                "missing": {str(b): listed(x) for b, x in self.missing.items()},
                "delivered": {str(b): n for b, n in self.delivered.items()}, "rows_read": self.rows_read,
                "deleted": {by: listed(x) for by, x in self.deleted.items()}}

    @classmethod
    def from_dict(cls, raw: dict) -> "SliceResult":
        def listed(x: list) -> Listed:
            return Listed(int(x[0]), tuple(int(o) for o in x[1]))
        return cls(SliceSpec.from_dict(raw["spec"]), listed(raw["duplicated_rows"]), int(raw["duplicated_offsets"]),
                   listed(raw["stray"]), listed(raw["dead_lettered"]),
                   {int(b): listed(x) for b, x in raw["missing"].items()},
                   {int(b): int(n) for b, n in raw["delivered"].items()}, int(raw["rows_read"]),
                   {by: listed(x) for by, x in raw.get("deleted", {}).items()})


def _counted(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values, sorted, and how often each occurs (by sorting: numpy's hashing
    ``unique`` took ~4x longer on a slice's offsets)."""
    ordered = np.sort(values)
    if ordered.size == 0:
        return ordered, np.zeros(0, dtype=np.int64)
    firsts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    return ordered[firsts], np.diff(np.append(firsts, ordered.size))


def _member(values: np.ndarray, distinct: np.ndarray) -> np.ndarray:
    """Boolean mask: which of ``values`` are in the sorted, distinct ``distinct``."""
    if distinct.size == 0 or values.size == 0:
        return np.zeros(values.shape, dtype=bool)
    at = np.minimum(np.searchsorted(distinct, values), distinct.size - 1)
    return distinct[at] == values


def compare_slice(spec: SliceSpec, kafka: np.ndarray, table: np.ndarray, dead: np.ndarray,
                  deleted: Mapping[str, np.ndarray] | None = None) -> SliceResult:
    """Compare one slice. ``kafka``: the offsets a read_committed consumer delivered in the
    slice's checked ranges; ``table`` / ``dead``: the offsets in ``[lo, hi)`` of the table's rows
    and of the dead letters, duplicates kept; ``deleted``: the offsets of rows a later commit
    deleted (deletion vectors), by that commit: delivered, and accounted for."""
    kafka, dead = _counted(kafka)[0], _counted(dead)[0]
    rows, counts = _counted(table)
    twice = counts > 1
    duplicated = Listed.of(rows[twice], int((counts[twice] - 1).sum()))
    # stray: a row outside every committed range, or inside a checked range at an offset Kafka does not deliver
    outside = ~_in_spans(rows, list(spec.committed))
    undelivered = _in_spans(rows, spec.kafka_spans) & ~_member(rows, kafka)
    in_dead = _member(kafka, dead)
    absent_mask = ~_member(kafka, rows) & ~in_dead
    gone: dict[str, Listed] = {}
    for by, offsets in (deleted or {}).items():
        was = absent_mask & _member(kafka, _counted(offsets)[0])
        if was.any():
            gone[by] = Listed.of(kafka[was])
            absent_mask &= ~was
    absent = kafka[absent_mask]
    missing: dict[int, Listed] = {}
    delivered: dict[int, int] = {}
    for b, s, e in spec.checked:
        part = absent[(absent >= s) & (absent < e)]
        if part.size:
            missing[b] = missing.get(b, Listed()).plus(Listed.of(part))
        delivered[b] = delivered.get(b, 0) + int(((kafka >= s) & (kafka < e)).sum())
    return SliceResult(spec, duplicated, int(twice.sum()), Listed.of(rows[outside | undelivered]),
                       Listed.of(kafka[in_dead]), missing, delivered, int(table.size), gone)


def unverifiable(scope: PartitionScope) -> list[Finding]:
    """The parts of ``scope``'s audited ranges below Kafka's log start (retention deleted them)."""
    out = []
    for b, r in scope.audited:
        if r.start < scope.log_start:
            end = min(r.end, scope.log_start)
            out.append(Finding(FindingKind.UNVERIFIABLE, scope.tp, end - r.start, start=r.start, end=end, batch=b.batch,
                               detail=f"Kafka's log starts at {scope.log_start}: retention deleted these offsets"))
    return out


def merge_slices(scope: PartitionScope, results: Iterable[SliceResult]) -> PartitionResult:
    """One partition's result from its slices' (in any order)."""
    tp, findings = scope.tp, unverifiable(scope)
    dup, dup_offsets, stray, dead = Listed(), 0, Listed(), Listed()
    gone: dict[str, Listed] = {}
    missing: dict[int, Listed] = {}
    delivered: dict[int, int] = {}
    checked = rows = 0
    for r in sorted(results, key=lambda r: r.spec.lo):
        dup, dup_offsets = dup.plus(r.duplicated_rows), dup_offsets + r.duplicated_offsets
        stray, dead = stray.plus(r.stray), dead.plus(r.dead_lettered)
        for by, x in r.deleted.items():
            gone[by] = gone.get(by, Listed()).plus(x)
        for b, x in r.missing.items():
            missing[b] = missing.get(b, Listed()).plus(x)
        for b, n in r.delivered.items():
            delivered[b] = delivered.get(b, 0) + n
        checked, rows = checked + r.spec.checked_offsets, rows + r.rows_read
    if dup.count:
        findings.append(Finding(FindingKind.DUPLICATED, tp, dup.count, dup.offsets,
                                detail=f"{dup_offsets} offset(s) held by more than one row"))
    if stray.count:
        findings.append(Finding(FindingKind.STRAY, tp, stray.count, stray.offsets,
                                detail="rows at offsets outside every committed range, or of aborted records or "
                                       "transaction markers"))
    if dead.count:
        findings.append(Finding(FindingKind.DEAD_LETTERED, tp, dead.count, dead.offsets))
    for by, x in sorted(gone.items()):
        findings.append(Finding(FindingKind.DELETED, tp, x.count, x.offsets,
                                detail=f"written by a batch, then deleted by {by or 'a later commit'}"))
    return PartitionResult(tp, tuple(findings), {b: x.offsets for b, x in missing.items()},
                           {b: x.count for b, x in missing.items()}, checked, rows, delivered)


def reconcile_partition(scope: PartitionScope, kafka: np.ndarray, table: np.ndarray, dead: np.ndarray,
                        committed: Sequence[tuple[int, int]]) -> PartitionResult:
    """Compare one partition in one slice. ``kafka``: the offsets a read_committed consumer
    delivered in the checked ranges; ``table`` / ``dead``: the offsets (≥ :attr:`PartitionScope.lowest`)
    of the table's rows and of the dead letters, duplicates kept; ``committed``: every batch's
    range of the partition (a row outside all of them is stray wherever it is)."""
    spec = SliceSpec(scope.tp, scope.lowest, None, tuple((b.batch, s, e) for b, s, e in scope.checked()),
                     tuple(_clip(_spans(committed), scope.lowest, None)))
    return merge_slices(scope, [compare_slice(spec, kafka, table[table >= scope.lowest], dead[dead >= scope.lowest])])


def account_batches(results: Sequence[PartitionResult], batches: Mapping[int, BatchRanges]) -> list[Finding]:
    """Offsets missing from the table: within a batch's recorded dropped duplicates (which are
    not in the table, nor dead letters when they were not sent there) they are accounted for;
    beyond that every missing offset of the batch is reported lost."""
    totals: dict[int, int] = {}
    for res in results:
        for batch, n in res.missing_counts.items():
            totals[batch] = totals.get(batch, 0) + n
    findings = []
    for res in results:
        for batch, n in sorted(res.missing_counts.items()):
            b = batches[batch]
            allowed = 0 if b.duplicates_to_dead_letters else b.dropped_duplicates
            if totals[batch] <= allowed:
                findings.append(Finding(FindingKind.DEDUPLICATED, res.tp, n, res.missing[batch], batch=batch,
                                        detail=f"the batch recorded {b.dropped_duplicates} dropped duplicate(s)"))
            else:
                why = f"; the batch recorded only {allowed} dropped duplicate(s)" if allowed else ""
                findings.append(Finding(FindingKind.LOST, res.tp, n, res.missing[batch], batch=batch,
                                        detail=f"delivered by Kafka, in neither the table nor the dead letters{why}"))
    return findings


@dataclass(frozen=True)
class MergeCounts:
    """What one merge commit recorded of the rows it wrote: ``inserted`` keys the table did not
    hold, ``deleted`` rows it removed (deletes, and a reprocess's replaced rows); the commit's
    updates replace a row by a row."""

    batch: int
    version: int
    inserted: int
    deleted: int


def check_merge_counts(commits: Sequence[MergeCounts], table_rows: int, complete: bool) -> list[Finding]:
    """Merge mode: the table holds one row per key, so its rows are the rows its merge commits
    inserted minus those they deleted. ``complete``: the log still holds every commit from the
    first batch on (else the sum cannot be made and nothing is claimed).

    >>> check_merge_counts([MergeCounts(1, 0, 5, 0), MergeCounts(2, 1, 2, 3)], 4, True)
    []
    >>> [f.count for f in check_merge_counts([MergeCounts(1, 0, 5, 0)], 7, True)]
    [2]
    """
    if not commits or not complete:
        return []
    expected = sum(c.inserted - c.deleted for c in commits)
    if expected == table_rows:
        return []
    return [Finding(FindingKind.ROW_COUNT, WHOLE_TABLE, abs(table_rows - expected), batch=commits[-1].batch,
                    detail=f"the table holds {table_rows} rows, its merge commits (batches {commits[0].batch}.."
                           f"{commits[-1].batch}) inserted minus deleted {expected}: rows were written or removed "
                           "outside airflow-eo")]


@dataclass(frozen=True)
class AuditReport:
    """The result of one audit: which batches, what was compared, and every finding."""

    table_uri: str
    ingest_id: str
    table_version: int
    batches: tuple[int, ...]
    through_version: int  # the newest table version among the audited batches' commits
    partitions: tuple[TopicPartition, ...]
    findings: tuple[Finding, ...]
    checked_offsets: int = 0
    rows_read: int = 0
    audited_at: str = ""
    note: str = ""
    engine: str = "in_process"  # where the coordinates were read: "in_process" or "spark" (Spark tasks)

    @property
    def drift(self) -> bool:
        return any(f.drift for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 1 if self.drift else 0

    def count(self, kind: FindingKind) -> int:
        return sum(f.count for f in self.findings if f.kind is kind)

    def counts(self) -> dict[str, int]:
        return {k.value: self.count(k) for k in FindingKind}

    def summary(self) -> str:
        c = self.counts()
        state = "DRIFT" if self.drift else "clean"
        shown = ", ".join(f"{k} {n}" for k, n in c.items() if n)
        span = f"batches {self.batches[0]}..{self.batches[-1]}" if self.batches else "no batches"
        return (f"audit {state}: {self.table_uri} ({self.ingest_id}) {span}, {len(self.partitions)} partition(s), "
                f"{self.checked_offsets} offsets checked, {self.rows_read} rows read" + (f"; {shown}" if shown else ""))

    def lines(self) -> list[str]:
        """One line per partition with a finding, then the summary."""
        by_tp: dict[TopicPartition, list[Finding]] = {}
        for f in self.findings:
            by_tp.setdefault(f.tp, []).append(f)
        out = []
        for tp, found in sorted(by_tp.items()):
            marked = "DRIFT" if any(f.drift for f in found) else "ok"
            out.append(f"{tp}: {marked}: " + "; ".join(str(f).split(" ", 1)[1] for f in found))
        if self.note:
            out.append(self.note)
        return [*out, self.summary()]

    def to_dict(self) -> dict:
        return {"table_uri": self.table_uri, "ingest_id": self.ingest_id, "table_version": self.table_version,
                "batches": list(self.batches), "through_version": self.through_version,
                "partitions": [str(tp) for tp in self.partitions], "drift": self.drift, "counts": self.counts(),
                "checked_offsets": self.checked_offsets, "rows_read": self.rows_read, "audited_at": self.audited_at,
                "note": self.note, "engine": self.engine, "findings": [f.to_dict() for f in self.findings]}
