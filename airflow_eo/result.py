"""What a run did: the ingestion loop's result (the operator's XCom) and a failure's one-line cause."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class IngestResult:
    """What a run did; ``to_dict()`` is the operator's XCom and Asset event extra."""

    status: str
    ingest_id: str
    table_uri: str
    run_key: str
    batch: int | None = None
    version: int | None = None
    attempt_id: str | None = None
    ranges: list[dict] = field(default_factory=list)
    rows: int = 0
    rows_per_partition: dict[str, int] = field(default_factory=dict)
    lag: dict[str, int] = field(default_factory=dict)
    spark_started: bool = False
    files: int = 0  # data files the commit added
    bytes: int = 0  # and their size
    dead_letters: int = 0  # records of the batch written to the dead-letter table instead
    seconds: float = 0.0  # the run's wall time (planning to verified commit)
    interval: dict | None = None  # interval mode: {"start_ms", "end_ms"} of the run's data interval
    late_records: int = 0  # interval mode: records of the batch whose timestamp is before the interval
    duplicates: int = 0  # dedup_key: records of the batch dropped as duplicates (their offsets are consumed)

    def to_dict(self) -> dict:
        return asdict(self)


_EXIT_CODE = re.compile(r"(?:[Ee]rror code is|exit(?:ed with)? code)[: ]+(-?\d+)")


def short_cause(error: BaseException) -> str:
    """One line on why a job failed: a spark-submit failure's exit code, not its command line."""
    text = str(error)
    code = _EXIT_CODE.search(text)
    if code and ("spark-submit" in text or "Cannot execute" in text):
        return f"spark-submit exited with code {code.group(1)}"
    return f"{error.__class__.__name__}: {(text.strip().splitlines() or [''])[0][:300]}"
