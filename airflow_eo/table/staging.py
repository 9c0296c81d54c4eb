"""Staged files: Parquet written by Spark beside the table, invisible until committed.

Each attempt writes into its own directory ``<table>/b<batch>-<attempt_id>/`` and keeps a
marker ``<table>/_airflow_eo/attempts/<attempt_id>.json`` that says when it started and
whether it has ended. A file becomes part of the table only when the Delta commit adds
it; the files of an attempt that never committed are orphans.

The directories are not hidden (no leading ``_``) on purpose: Delta's own VACUUM
then also sees and removes them, and committed files live in a normal data path.

Example::

    >>> stage = StagingArea(TableLocation.of("/data/orders"))          # doctest: +SKIP
    >>> stage.begin_attempt(attempt)                                   # doctest: +SKIP
    '/data/orders/b00000007-3f2a9c0d1e6b4a52'
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import timezone

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from airflow_eo.attempt import TIMESTAMP_COLUMN, Attempt, AttemptKind
from airflow_eo.spec import KEY_COLUMNS
from airflow_eo.core.planning import BatchPlan
from airflow_eo.spec import DEFAULT_GRACE_SECONDS  # the default of the staging_grace_seconds option
from airflow_eo.table.mapping import ColumnNames
from airflow_eo.table.liveness import (
    Liveness, ProcessId, ProcessState, liveness, remove_scratch, renew_every, scratch_attempt_ids,
)
from airflow_eo.table.files import FEED_SUFFIX, StagedFile
from airflow_eo.table.partitioning import partition_values_of
from airflow_eo.table.storage import TableLocation

log = logging.getLogger(__name__)

ATTEMPTS_DIR = "_airflow_eo/attempts"


def new_attempt_id() -> str:
    return uuid.uuid4().hex[:16]


def attempt_dir_name(plan: BatchPlan) -> str:
    return f"b{plan.batch:08d}-{plan.attempt_id}"


# Beside a reprocess attempt's directory: its copies of files shared with other batches
# (rows of other batches, so never one batch's directory; see commit._Reprocess.actions).
KEPT_SUFFIX = "-kept"


def attempt_dir_of(path: str) -> str:
    """The attempt directory a staged file's relative path lies in."""
    return path.split("/", 1)[0]


@dataclass(frozen=True)
class AttemptMarker:
    attempt_id: str
    batch: int
    run_key: str
    started_at: float
    ended_at: float | None = None
    committed: bool = False
    host: str = ""  # the process that submitted the attempt (the Airflow task, the CLI)
    pid: int = 0
    attempt: str = ""  # Attempt JSON: what this attempt reads and commits, never secrets
    driver_host: str = ""  # where the attempt's driver runs (it commits), once it has started
    driver_pid: int = 0
    error: str = ""  # the driver's failure as one line (airflow_eo.core.errors.error_line), for its caller
    # start times of pid and driver_pid (epoch s; PID reuse), and what the attempt is for: a run
    # need not wait for an ingest attempt whose batch is committed (all 0/"" in older markers)
    pid_started: float = 0.0
    driver_pid_started: float = 0.0
    ingest_id: str = ""
    kind: str = ""

    @classmethod
    def from_json(cls, text: str) -> "AttemptMarker | None":
        try:
            raw = json.loads(text)
            return cls(**{k: v for k, v in raw.items() if k in cls.__dataclass_fields__})
        except (ValueError, TypeError):
            return None  # torn or foreign: treated as no marker (age decides)

    @property
    def submitter(self) -> ProcessId:
        """The process that submitted it."""
        return ProcessId(self.host, self.pid, self.pid_started)

    @property
    def driver(self) -> ProcessId:
        """The process that commits it (no PID: not started yet)."""
        return ProcessId(self.driver_host, self.driver_pid, self.driver_pid_started)


class StagingArea:
    """Attempt directories and markers of one table."""

    def __init__(self, location: TableLocation):
        self.loc = location

    def attempt_path(self, plan: BatchPlan) -> str:
        return self.loc.join(attempt_dir_name(plan))

    def feed_path(self, plan: BatchPlan) -> str:
        """Where the attempt's read stages its records for the tables whose rows need Spark."""
        return self.loc.join(attempt_dir_name(plan) + FEED_SUFFIX)

    def marker_path(self, attempt_id: str) -> str:
        return self.loc.join(ATTEMPTS_DIR, f"{attempt_id}.json")

    def heartbeat_path(self, attempt_id: str) -> str:
        return self.loc.join(ATTEMPTS_DIR, f"{attempt_id}.alive")

    def renew(self, attempt_id: str) -> None:
        """Say the attempt is alive now (a file of its own: the marker's writers never race it)."""
        self.loc.write_text(self.heartbeat_path(attempt_id), json.dumps({"renewed_at": time.time()}))

    def renewed_at(self, attempt_id: str) -> float | None:
        text = self.loc.read_text(self.heartbeat_path(attempt_id))
        try:
            return float(json.loads(text)["renewed_at"]) if text else None
        except (ValueError, KeyError, TypeError):
            return None

    def liveness(self, marker: AttemptMarker, grace_seconds: float, now: float | None = None) -> Liveness:
        """The one rule (:func:`airflow_eo.table.liveness.liveness`), with the attempt's heartbeat read
        only when its marker alone would call it dead."""
        found = liveness(marker, grace_seconds, now)
        if found is Liveness.DEAD and marker.ended_at is None and marker.driver.state() is not ProcessState.GONE:
            found = liveness(marker, grace_seconds, now, self.renewed_at(marker.attempt_id))
        return found

    def begin_attempt(self, attempt: Attempt) -> str:
        """Record that an attempt starts (before it writes a byte) and return its directory."""
        plan, me = attempt.plan, ProcessId.current()
        marker = AttemptMarker(
            plan.attempt_id, plan.batch, plan.run.run_key, time.time(),
            host=me.host, pid=me.pid, attempt=attempt.to_json(), pid_started=me.started,
            ingest_id=plan.ingest_id, kind=attempt.kind.value,
        )
        self._write_marker(marker)
        return self.attempt_path(plan)

    def renumber(self, plan: BatchPlan, batch: int, files: tuple[StagedFile, ...]) -> tuple[StagedFile, ...]:
        """Move ``plan``'s attempt directory to the one of ``batch`` (a rebased interval batch, before
        its commit names the files) and return ``files`` with their new paths. One rename on a local
        or HDFS path; file by file on an object store (a copy that is cut short leaves both
        directories uncommitted, for orphan collection)."""
        old, new = attempt_dir_name(plan), attempt_dir_name(replace(plan, batch=batch))
        source, target = self.loc.join(old), self.loc.join(new)
        if self.loc.fs.get_file_info(source).type != pafs.FileType.NotFound:
            if isinstance(self.loc.fs, (pafs.LocalFileSystem, pafs.HadoopFileSystem)):
                self.loc.fs.move(source, target)
            else:
                for info in self.loc.list_files(source):
                    self.loc.fs.move(info.path, target + info.path[len(source):])
        return tuple(replace(f, path=new + f.path[len(old):]) if attempt_dir_of(f.path) == old else f for f in files)

    def driver_started(self, attempt_id: str) -> None:
        """Record the process that will commit the attempt: once it is gone, the attempt is over."""
        marker = self.read_marker(attempt_id)
        if marker is not None and marker.ended_at is None:
            me = ProcessId.current()
            self._write_marker(replace(marker, driver_host=me.host, driver_pid=me.pid, driver_pid_started=me.started))

    def record_error(self, attempt_id: str, line: str) -> None:
        """Leave the driver's failure where its caller finds it, whatever ran the driver
        (spark-submit on YARN or Kubernetes reports only an exit code)."""
        marker = self.read_marker(attempt_id)
        if marker is not None:
            self._write_marker(AttemptMarker(**{**marker.__dict__, "error": line}))

    def end_attempt(self, attempt_id: str, committed: bool = False) -> None:
        """Mark an attempt over: its files may be collected unless it committed (its heartbeat has said all it
        had to: the marker says it ended)."""
        try:
            self.loc.fs.delete_file(self.heartbeat_path(attempt_id))
        except FileNotFoundError:
            pass
        marker = self.read_marker(attempt_id)
        if marker is None or marker.ended_at is not None and marker.committed >= committed:
            return
        self._write_marker(
            AttemptMarker(**{**marker.__dict__, "ended_at": time.time(), "committed": committed})
        )

    def read_attempt(self, attempt_id: str) -> Attempt:
        """The attempt as its caller recorded it before starting Spark."""
        marker = self.read_marker(attempt_id)
        if marker is None or not marker.attempt:
            raise FileNotFoundError(
                f"attempt {attempt_id} has no marker under {self.loc.join(ATTEMPTS_DIR)}: start the "
                "job through `airflow-eo ingest` or the operator, which log the plan first"
            )
        return Attempt.from_json(marker.attempt)

    def read_marker(self, attempt_id: str) -> AttemptMarker | None:
        text = self.loc.read_text(self.marker_path(attempt_id))
        return None if text is None else AttemptMarker.from_json(text)

    def _write_marker(self, marker: AttemptMarker) -> None:
        self.loc.write_text(self.marker_path(marker.attempt_id), json.dumps(marker.__dict__))

    def markers(self) -> list[AttemptMarker]:
        """Every attempt marker of the table (ended or not)."""
        found = []
        for info in self.loc.list_files(self.loc.join(ATTEMPTS_DIR)):
            if info.base_name.endswith(".json"):
                marker = self.read_marker(info.base_name[:-5])
                if marker is not None:
                    found.append(marker)
        return found

    def running_attempts(self, grace_seconds: float = DEFAULT_GRACE_SECONDS,
                         now: float | None = None) -> list[AttemptMarker]:
        """Attempts that may still be running (:func:`airflow_eo.table.liveness.liveness`)."""
        return [m for m in self.markers() if self.liveness(m, grace_seconds, now) is Liveness.RUNNING]

    def blocking_attempts(self, run_key: str | None, committed_batch: Callable[[str], int | None],
                          grace_seconds: float = DEFAULT_GRACE_SECONDS,
                          now: float | None = None) -> list[AttemptMarker]:
        """The running attempts a run of ``run_key`` waits for before planning. Not those of its
        own run key (a retry replays its plan; the compare-and-set commit protects the table),
        nor an ingest attempt whose batch is already committed (``committed_batch(ingest_id)``:
        the ingest's last committed batch), which can never commit again."""
        blocking = []
        for marker in self.running_attempts(grace_seconds, now):
            if run_key is not None and marker.run_key == run_key:
                continue
            if marker.kind == AttemptKind.INGEST.value and marker.ingest_id:
                last = committed_batch(marker.ingest_id)
                if last is not None and last >= marker.batch:
                    continue
            blocking.append(marker)
        return blocking

    def collect_scratch(self, grace_seconds: float = DEFAULT_GRACE_SECONDS, now: float | None = None) -> list[str]:
        """Remove this host's Spark scratch of the table's attempts that ended or are dead. Starts from
        the few scratch directories on this host, not the table's many markers; a directory whose
        attempt has no marker here belongs to another table and is left to that table's runs."""
        removed = []
        for attempt_id in scratch_attempt_ids():
            marker = self.read_marker(attempt_id)
            if marker is not None and self.liveness(marker, grace_seconds, now) is not Liveness.RUNNING \
                    and remove_scratch(attempt_id):
                removed.append(attempt_id)
        return removed

    def staged_files(self, attempt_path: str, only: set[str] | None = None,
                     names: ColumnNames | None = None) -> list[StagedFile]:
        """Every Parquet data file an attempt wrote, with Delta stats from the footers.

        ``only``: full paths to keep (the files successful tasks reported), so that files
        of failed task attempts in the same directory are never staged; ``names``: the table's
        column mapping (the files hold physical names, the stats are kept by them)."""
        staged = []
        for info in self.loc.list_files(attempt_path):
            name = info.base_name
            if name.startswith(("_", ".")) or not name.endswith(".parquet"):
                continue
            if only is not None and info.path not in only:
                continue
            staged.append(staged_file(self.loc, info, names))
        return sorted(staged, key=lambda f: f.path)

    def rows_per_partition(self, files: list[StagedFile], names: ColumnNames | None = None) -> dict[str, int]:
        """Rows staged per ``topic[partition]``, read from two columns of the files (by their
        physical names under column mapping)."""
        if not files:
            return {}
        import pyarrow.dataset as pads  # here, not at import: it imports pandas (~0.3 s of every command)

        names = names or ColumnNames()
        paths = [self.loc.join(f.path) for f in files]
        table = pads.dataset(paths, format="parquet", filesystem=self.loc.fs).to_table(
            columns=[names.physical("topic"), names.physical("partition")]
        ).rename_columns(["topic", "partition"])
        counts = table.group_by(["topic", "partition"]).aggregate([([], "count_all")])
        return {
            f"{t}[{p}]": n
            for t, p, n in zip(
                counts["topic"].to_pylist(), counts["partition"].to_pylist(), counts["count_all"].to_pylist()
            )
        }

    def collect_orphans(
        self, referenced: set[str], grace_seconds: float = DEFAULT_GRACE_SECONDS, now: float | None = None
    ) -> list[str]:
        """Delete attempt directories that never committed and can no longer be running.

        An attempt's files are deleted only when none of them is in the table and the
        attempt is not running by :func:`airflow_eo.table.liveness.liveness`: its marker says
        it ended (written by the job itself or by whoever watched spark-submit exit), its
        processes on this host are gone (a killed task, CLI or driver), or it started longer
        than ``grace_seconds`` ago, the bound on how long one attempt may run. A running
        attempt has no end mark, a live process or a recent start, so it is never touched.
        """
        now = time.time() if now is None else now
        removed = []
        referenced_dirs = {p.split("/", 1)[0] for p in referenced}
        for info in self.loc.list_dirs(self.loc.root):
            name = info.base_name
            if not name.startswith("b") or "-" not in name or name in referenced_dirs:
                continue
            feed = name.endswith(FEED_SUFFIX)  # never in the table: it goes once its attempt is not running
            attempt_id = name.split("-", 1)[1].removesuffix(KEPT_SUFFIX).removesuffix(FEED_SUFFIX)  # copies go with it
            marker = self.read_marker(attempt_id)
            if marker is not None and marker.committed and not feed:
                continue
            if marker is not None:
                if self.liveness(marker, grace_seconds, now) is Liveness.RUNNING:
                    continue
            elif info.mtime is None or now - info.mtime.timestamp() < grace_seconds:
                continue  # no marker (torn, or pruned): only its age can tell
            try:
                self.loc.fs.delete_dir(info.path)
            except OSError as exc:
                # A dead driver's tasks may still be writing here (a Connect server finishes
                # them): housekeeping must not fail the ingest; the next run tries again.
                log.info("left the staged files of ended attempt %s for the next run: %s", name, exc)
                continue
            if marker is not None and marker.ended_at is not None and not feed:
                # A driver that died without ending its attempt may leave Spark tasks writing
                # for a while (a Connect server finishes them): keep its marker, so files
                # written after this pass are known as that dead attempt's and go next time.
                self.loc.fs.delete_file(self.marker_path(attempt_id))
                try:
                    self.loc.fs.delete_file(self.heartbeat_path(attempt_id))
                except FileNotFoundError:
                    pass  # an attempt that never renewed (or of an earlier version)
            removed.append(name)
            log.info("removed orphaned staged files of attempt %s", name)
        return removed


class Heartbeat:
    """While the block runs, a thread renews the attempts' heartbeats (:meth:`StagingArea.renew`), so another
    host's rule sees them alive however long they run. A renewal that fails is retried by the next."""

    def __init__(self, attempts: Iterable[tuple[StagingArea, str]], grace_seconds: float):
        self.attempts, self.every = list(attempts), renew_every(grace_seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renewing, name="airflow-eo-heartbeat", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self._beat()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _beat(self) -> None:
        for staging, attempt_id in self.attempts:
            try:
                staging.renew(attempt_id)
            except OSError as exc:
                log.warning("could not renew the heartbeat of attempt %s: %s", attempt_id, exc)

    def _renewing(self) -> None:
        while not self._stop.wait(self.every):
            self._beat()


def missing_staged(location: TableLocation, files: Iterable[StagedFile]) -> list[str]:
    """The staged files (relative paths) no longer there: one listing per attempt directory."""
    wanted: dict[str, list[str]] = {}
    for f in files:
        wanted.setdefault(attempt_dir_of(f.path), []).append(f.path)
    missing = []
    for directory, paths in sorted(wanted.items()):
        present = {location.relative(i.path) for i in location.list_files(location.join(directory))}
        missing += [p for p in paths if p not in present]
    return missing


def collect_orphans(table_uri: str, storage_options: dict | None, grace_seconds: float) -> list[str]:
    """Remove the staged files of dead attempts under ``table_uri`` (main or dead-letter table).

    A dead-letter table's attempts keep their markers beside the main table, so there the
    attempt's age is the only safe test (see :meth:`StagingArea.collect_orphans`).
    """
    from airflow_eo.table.ledger import Ledger

    location = TableLocation.of(table_uri, storage_options)
    if location.fs.get_file_info(location.root).type.name != "Directory":
        return []
    referenced = Ledger.open(table_uri, storage_options).file_paths()
    return StagingArea(location).collect_orphans(referenced, grace_seconds)


def staged_file(location: TableLocation, info, names: ColumnNames | None = None) -> StagedFile:
    """A written Parquet file (``info``: its pyarrow ``FileInfo``) with what its add action needs."""
    meta = pq.read_metadata(info.path, filesystem=location.fs)
    relative = location.relative(info.path)
    return StagedFile(
        path=relative,
        size=info.size,
        modification_time=int(info.mtime.timestamp() * 1000) if info.mtime else int(time.time() * 1000),
        num_records=meta.num_rows,
        stats=json.dumps(file_stats(meta, names)),
        partition_values=partition_values_of(relative),
    )


def file_stats(meta: pq.FileMetaData, mapping: ColumnNames | None = None) -> dict:
    """Delta per-file stats: numRecords, min/max/nullCount of the key columns, and of the
    Kafka ``timestamp`` when the file keeps it as a timestamp (dedup's horizon and the late
    count prune files by it). Under column mapping (``mapping``) the file holds, and the stats
    are kept by, physical names."""
    stats: dict = {"numRecords": meta.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    physical = (mapping or ColumnNames()).physical
    for column in (physical(c) for c in KEY_COLUMNS):
        if column not in names:
            continue
        bounds = column_bounds(meta, names.index(column))
        if bounds is None or bounds[0] is None:
            return {"numRecords": meta.num_rows}
        stats["minValues"][column], stats["maxValues"][column], stats["nullCount"][column] = bounds
    timestamp = physical(TIMESTAMP_COLUMN)
    if timestamp in names:
        idx = names.index(timestamp)
        bounds = column_bounds(meta, idx) if meta.schema.column(idx).logical_type.type == "TIMESTAMP" else None
        if bounds is not None and getattr(bounds[0], "tzinfo", None) is not None:  # UTC-adjusted, not NTZ
            low, high, nulls = bounds
            # as delta-rs writes them: ISO-8601 UTC truncated to the millisecond (exact for
            # comparisons with whole milliseconds, which Kafka timestamps are)
            stats["minValues"][timestamp] = _iso_millis(low)
            stats["maxValues"][timestamp] = _iso_millis(high)
            stats["nullCount"][timestamp] = nulls
    return stats


def column_bounds(meta: pq.FileMetaData, idx: int):
    """(min, max, null count) of column ``idx`` over the row groups; None without statistics.
    A column that is all nulls has (None, None, n)."""
    lows, highs, nulls = [], [], 0
    for rg in range(meta.num_row_groups):
        st = meta.row_group(rg).column(idx).statistics
        if st is None:
            return None
        nulls += st.null_count or 0
        if st.has_min_max:
            lows.append(st.min)
            highs.append(st.max)
        elif (st.null_count or 0) < meta.row_group(rg).num_rows:
            return None
    return (min(lows) if lows else None, max(highs) if highs else None, nulls)


def _iso_millis(value) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
