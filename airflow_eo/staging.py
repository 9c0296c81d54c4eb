"""Staged files: Parquet written by Spark beside the table, invisible until committed.

Each attempt writes into its own directory ``<table>/b<batch>-<attempt_id>/`` and keeps a
marker ``<table>/_airflow_eo/attempts/<attempt_id>.json`` that says when it started and
whether it has ended. A file becomes part of the table only when the Delta commit adds
it; the files of an attempt that never committed are orphans.

The directories are not hidden (no leading ``_``) on purpose: Delta's own VACUUM
then also sees and removes them, and committed files live in a normal data path.

Example::

    >>> stage = StagingArea(TableLocation.of("/data/orders"))          # doctest: +SKIP
    >>> stage.begin_attempt(plan)                                      # doctest: +SKIP
    '/data/orders/b00000007-3f2a9c0d1e6b4a52'
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass

import pyarrow.dataset as pads
import pyarrow.parquet as pq

from airflow_eo.planning import BatchPlan
from airflow_eo.storage import TableLocation

log = logging.getLogger(__name__)

ATTEMPTS_DIR = "_airflow_eo/attempts"
KEY_COLUMNS = ("topic", "partition", "offset")
DEFAULT_GRACE_SECONDS = 24 * 3600


def new_attempt_id() -> str:
    return uuid.uuid4().hex[:16]


def attempt_dir_name(plan: BatchPlan) -> str:
    return f"b{plan.batch:08d}-{plan.attempt_id}"


@dataclass(frozen=True)
class StagedFile:
    """One Parquet file an attempt staged, with what its Delta add action needs."""

    path: str  # relative to the table root
    size: int
    modification_time: int  # epoch ms
    num_records: int
    stats: str  # Delta stats JSON


@dataclass(frozen=True)
class AttemptMarker:
    attempt_id: str
    batch: int
    run_key: str
    started_at: float
    ended_at: float | None = None
    committed: bool = False
    host: str = ""
    pid: int = 0
    plan: str = ""  # BatchPlan JSON: what this attempt reads and commits
    job: dict | None = None  # job options (transform, task size), never secrets


class StagingArea:
    """Attempt directories and markers of one table."""

    def __init__(self, location: TableLocation):
        self.loc = location

    def attempt_path(self, plan: BatchPlan) -> str:
        return self.loc.join(attempt_dir_name(plan))

    def marker_path(self, attempt_id: str) -> str:
        return self.loc.join(ATTEMPTS_DIR, f"{attempt_id}.json")

    def begin_attempt(self, plan: BatchPlan, job: dict | None = None) -> str:
        """Record that an attempt starts (before it writes a byte) and return its directory."""
        marker = AttemptMarker(
            plan.attempt_id, plan.batch, plan.run.run_key, time.time(),
            host=socket.gethostname(), pid=os.getpid(), plan=plan.to_json(), job=job or {},
        )
        self._write_marker(marker)
        return self.attempt_path(plan)

    def end_attempt(self, attempt_id: str, committed: bool = False) -> None:
        """Mark an attempt over: its files may be collected unless it committed."""
        marker = self.read_marker(attempt_id)
        if marker is None or marker.ended_at is not None and marker.committed >= committed:
            return
        self._write_marker(
            AttemptMarker(**{**marker.__dict__, "ended_at": time.time(), "committed": committed})
        )

    def attempt_plan(self, attempt_id: str) -> tuple[BatchPlan, dict]:
        """The plan and job options an attempt was started with."""
        marker = self.read_marker(attempt_id)
        if marker is None or not marker.plan:
            raise FileNotFoundError(
                f"attempt {attempt_id} has no marker under {self.loc.join(ATTEMPTS_DIR)}: start the "
                "job through `airflow-eo ingest` or the operator, which log the plan first"
            )
        return BatchPlan.from_json(marker.plan), dict(marker.job or {})

    def read_marker(self, attempt_id: str) -> AttemptMarker | None:
        text = self.loc.read_text(self.marker_path(attempt_id))
        if text is None:
            return None
        try:
            return AttemptMarker(**json.loads(text))
        except (ValueError, TypeError):
            return None

    def _write_marker(self, marker: AttemptMarker) -> None:
        self.loc.write_text(self.marker_path(marker.attempt_id), json.dumps(marker.__dict__))

    def staged_files(self, attempt_path: str, only: set[str] | None = None) -> list[StagedFile]:
        """Every Parquet data file an attempt wrote, with Delta stats from the footers.

        ``only``: full paths to keep (the files successful tasks reported), so that files
        of failed task attempts in the same directory are never staged."""
        staged = []
        for info in self.loc.list_files(attempt_path):
            name = info.base_name
            if name.startswith(("_", ".")) or not name.endswith(".parquet"):
                continue
            if only is not None and info.path not in only:
                continue
            meta = pq.read_metadata(info.path, filesystem=self.loc.fs)
            staged.append(
                StagedFile(
                    path=self.loc.relative(info.path),
                    size=info.size,
                    modification_time=int(info.mtime.timestamp() * 1000) if info.mtime else int(time.time() * 1000),
                    num_records=meta.num_rows,
                    stats=json.dumps(file_stats(meta)),
                )
            )
        return sorted(staged, key=lambda f: f.path)

    def rows_per_partition(self, files: list[StagedFile]) -> dict[str, int]:
        """Rows staged per ``topic[partition]``, read from two columns of the files."""
        if not files:
            return {}
        paths = [self.loc.join(f.path) for f in files]
        table = pads.dataset(paths, format="parquet", filesystem=self.loc.fs).to_table(
            columns=["topic", "partition"]
        )
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
        attempt is known to have ended (its marker says so: written by the job itself or
        by whoever watched spark-submit exit) or it started longer than ``grace_seconds``
        ago, the bound on how long one attempt may run. A running attempt has no end mark
        and a recent start, so it is never touched.
        """
        now = time.time() if now is None else now
        removed = []
        referenced_dirs = {p.split("/", 1)[0] for p in referenced}
        for info in self.loc.list_dirs(self.loc.root):
            name = info.base_name
            if not name.startswith("b") or "-" not in name or name in referenced_dirs:
                continue
            attempt_id = name.split("-", 1)[1]
            marker = self.read_marker(attempt_id)
            if marker is not None and marker.committed:
                continue
            started = marker.started_at if marker else (info.mtime.timestamp() if info.mtime else now)
            ended = marker is not None and marker.ended_at is not None
            if not ended and now - started < grace_seconds:
                continue
            self.loc.fs.delete_dir(info.path)
            if marker is not None:
                self.loc.fs.delete_file(self.marker_path(attempt_id))
            removed.append(name)
            log.info("removed orphaned staged files of attempt %s", name)
        return removed


def file_stats(meta: pq.FileMetaData) -> dict:
    """Delta per-file stats (numRecords, min/max/nullCount of the key columns)."""
    stats: dict = {"numRecords": meta.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    for column in KEY_COLUMNS:
        if column not in names:
            continue
        idx = names.index(column)
        lows, highs, nulls = [], [], 0
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(idx).statistics
            if st is None or not st.has_min_max:
                return {"numRecords": meta.num_rows}
            lows.append(st.min)
            highs.append(st.max)
            nulls += st.null_count or 0
        if lows:
            stats["minValues"][column] = min(lows)
            stats["maxValues"][column] = max(highs)
            stats["nullCount"][column] = nulls
    return stats
