"""The audit log: each audit's result, written beside the table (``<table>/_airflow_eo/audits/``).

One JSON document per audit, named by its time so that the newest sorts last; the newest of
an ingest is where the next audit starts by default (``through_version``) and what ``status``
shows. ``maintain --prune`` deletes older ones after ``keep_days`` but always keeps each
ingest's newest.

Example::

    >>> audits = AuditLog(TableLocation.of("/data/orders"))            # doctest: +SKIP
    >>> audits.last("orders_raw").through_version                     # doctest: +SKIP
    42
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass

from airflow_eo.table.storage import TableLocation

log = logging.getLogger(__name__)

AUDITS_DIR = "_airflow_eo/audits"


@dataclass(frozen=True)
class AuditRecord:
    """What status and the next audit need of a past audit (the file holds the whole report)."""

    ingest_id: str
    audited_at: str
    through_version: int
    drift: bool
    summary: str
    path: str = ""

    @classmethod
    def from_json(cls, text: str, path: str = "") -> "AuditRecord":
        raw = json.loads(text)
        return cls(raw["ingest_id"], raw["audited_at"], int(raw["through_version"]), bool(raw["drift"]),
                   raw.get("summary", ""), path)


def _ingest_dir(ingest_id: str) -> str:
    return hashlib.sha256(ingest_id.encode()).hexdigest()[:16]


class AuditLog:
    def __init__(self, location: TableLocation):
        self.loc = location

    def directory(self, ingest_id: str) -> str:
        return self.loc.join(AUDITS_DIR, _ingest_dir(ingest_id))

    def record(self, ingest_id: str, audited_at: str, report_json: str) -> str:
        """Write one audit's report; ``audited_at`` (ISO-8601, UTC) names the file."""
        stamp = audited_at.replace(":", "").replace("-", "").replace("+0000", "Z")
        path = f"{self.directory(ingest_id)}/{stamp}.json"
        self.loc.write_text(path, report_json)
        log.info("recorded the audit of %s at %s", ingest_id, path)
        return path

    def paths(self, ingest_id: str) -> list[str]:
        return sorted(i.path for i in self.loc.list_files(self.directory(ingest_id)) if i.base_name.endswith(".json"))

    def last(self, ingest_id: str) -> AuditRecord | None:
        """The newest readable audit of ``ingest_id`` (None: never audited)."""
        for path in reversed(self.paths(ingest_id)):
            text = self.loc.read_text(path)
            try:
                return AuditRecord.from_json(text, path) if text else None
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring unreadable audit record %s", path)
        return None

    def newest_of_each(self) -> set[str]:
        """The newest audit file of every ingest (what pruning keeps)."""
        keep = set()
        for d in self.loc.list_dirs(self.loc.join(AUDITS_DIR)):
            files = sorted(i.path for i in self.loc.list_files(d.path) if i.base_name.endswith(".json"))
            if files:
                keep.add(files[-1])
        return keep
