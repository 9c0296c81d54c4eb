"""A table's recent commits, newest first, each committed version read from its log once per process.

A committed Delta version never changes, so what its commitInfo says (commit time, Delta
operation and, of airflow-eo's batch metadata, the counts: :class:`BatchCounts`) is kept after the
first read: a later read of the same table reads only the versions committed since. The cache
is keyed by the table's URI *and* its Delta table id, so a table deleted and created again at
the same path is read anew. It is bounded (versions per table, tables) and safe to share
between threads. Used by the Airflow UI page (:mod:`airflow_eo.ui`), which reads every
table's recent commits on each view.

Reads go through the :class:`~airflow_eo.table.ledger.Ledger`'s snapshot (``history``), so
they see the same version as every other lookup of that ledger, and what log cleanup
removed is gone here too (unless it was read before).

Example::

    >>> history = CommitHistory()
    >>> recent = history.recent(Ledger.open("/data/orders"), limit=500, since_ms=now_ms - 86_400_000)  # doctest: +SKIP
    >>> recent.commits[0].version, recent.complete                                        # doctest: +SKIP
    (812, True)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from airflow_eo.table.ledger import BatchRecord, Ledger
from airflow_eo.table.metadata import CommitKind, BatchMetadata

FIRST_WINDOW = 64  # commits asked for by a first read of a table; if more are needed, all of them next


@dataclass(frozen=True)
class BatchCounts:
    """What the history keeps of an airflow-eo commit: whose, which batch, what kind, how much. Not
    its ranges: a commit names every partition, and thousands of commits are kept per table."""

    ingest_id: str
    batch: int
    kind: CommitKind
    rows: int
    dead_letters: int
    write_mode: str

    @classmethod
    def of(cls, meta: BatchMetadata) -> "BatchCounts":
        return cls(meta.ingest_id, meta.batch, meta.operation, meta.rows, meta.dead_letter_records, meta.write_mode.value)


@dataclass(frozen=True)
class Commit:
    """One version of a table: when, which Delta operation, and airflow-eo's counts of it (if any)."""

    version: int
    timestamp_ms: int | None
    operation: str  # Delta's: WRITE, OPTIMIZE, ...
    batch: BatchCounts | None

    @classmethod
    def from_commit_info(cls, info: dict) -> "Commit":
        stamp, record = info.get("timestamp"), BatchRecord.from_commit_info(info)
        return cls(int(info["version"]), int(stamp) if stamp is not None else None, str(info.get("operation") or ""),
                   BatchCounts.of(record.meta) if record is not None else None)


@dataclass(frozen=True)
class RecentCommits:
    """Commits newest first; ``complete``: they reach back to ``since_ms`` (or to the oldest
    commit the log still holds), i.e. ``limit`` did not cut them short."""

    commits: tuple[Commit, ...]
    complete: bool


class _Table:
    """What is known of one table: commits by version, and the oldest version its log holds."""

    def __init__(self) -> None:
        self.commits: dict[int, Commit] = {}
        self.floor: int | None = None  # below it the log holds nothing (cleaned, or version 0)


class CommitHistory:
    """Commits of many tables, each version read once (see the module doc)."""

    def __init__(self, versions_per_table: int = 5000, tables: int = 1000):
        self.versions_per_table, self.max_tables = versions_per_table, tables
        self._tables: OrderedDict[tuple[str, str], _Table] = OrderedDict()
        self._lock = threading.Lock()
        self.reads = 0  # history() calls made: what the cache saves is visible (tests, benchmark)

    def _known(self, key: tuple[str, str]) -> _Table:
        with self._lock:
            known = self._tables.pop(key, None) or _Table()
            self._tables[key] = known  # most recently used last
            while len(self._tables) > self.max_tables:
                self._tables.popitem(last=False)
            return known

    def _read(self, ledger: Ledger, known: _Table, count: int) -> None:
        """The newest ``count`` versions from the ledger's snapshot into ``known``."""
        assert ledger.table is not None
        entries = ledger.table.history(count)
        self.reads += 1
        fetched = [Commit.from_commit_info(e) for e in entries if e.get("version") is not None]
        with self._lock:
            for commit in fetched:
                known.commits[commit.version] = commit
            if len(entries) < count:  # the log holds no more than that
                known.floor = min((c.version for c in fetched), default=(ledger.version or 0) + 1)
            for version in sorted(known.commits)[:max(0, len(known.commits) - self.versions_per_table)]:
                del known.commits[version]

    def recent(self, ledger: Ledger, *, limit: int, since_ms: int | None = None) -> RecentCommits:
        """Up to ``limit`` commits of the ledger's snapshot, newest first, stopping at the first
        committed before ``since_ms`` (epoch ms)."""
        if ledger.table is None or limit <= 0:
            return RecentCommits((), ledger.table is None)
        newest = ledger.version or 0
        known = self._known((ledger.table_uri, str(ledger.table.metadata().id)))
        cached = [v for v in known.commits if v <= newest]
        if cached and max(cached) < newest:  # the commits since the last read
            self._read(ledger, known, newest - max(cached))
        out: list[Commit] = []
        version, first = newest, True
        while len(out) < limit and version >= 0:
            commit = known.commits.get(version)
            if commit is None:
                if known.floor is not None and version < known.floor:
                    break  # the log holds nothing older
                # first a window that covers most tables' recent past, then all that may be needed
                rest = min(newest - version + limit - len(out), newest + 1)
                self._read(ledger, known, min(max(FIRST_WINDOW, newest - version + 1), rest) if first else rest)
                first = False
                if version not in known.commits:
                    if known.floor is not None and version < known.floor:
                        break
                    version -= 1  # a version without commitInfo: nothing to show of it
                continue
            if since_ms is not None and commit.timestamp_ms is not None and commit.timestamp_ms < since_ms:
                return RecentCommits(tuple(out), True)
            out.append(commit)
            version -= 1
        return RecentCommits(tuple(out), version < 0 or (known.floor is not None and version < known.floor))
