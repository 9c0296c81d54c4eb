"""Late records: rows of an interval batch whose Kafka timestamp is before the interval.

Interval mode assigns records by offset (:mod:`airflow_eo.core.intervals`), so a record that
arrived late is ingested once, in the interval where it arrived; this counts them for the
batch's commit metadata (``late: {records, oldest_ms}``). When the table keeps the
``timestamp`` column, the staged files are read (only that column, and only files whose
statistics allow a late row); a transform that drops it makes the count one more pass over
the batch's records in Spark.

Example::

    >>> late_records(files, location, arrow_schema, start_ms=1772582400000, source=df)  # doctest: +SKIP
    {'records': 3, 'oldest_ms': 1772578800123}
"""

from __future__ import annotations

import json
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_eo.attempt import TIMESTAMP_COLUMN
from airflow_eo.table.files import StagedFile
from airflow_eo.table.storage import TableLocation


def _may_be_late(f: StagedFile, start_ms: int, column: str = TIMESTAMP_COLUMN) -> bool:
    """From the file's Delta stats: can it hold a timestamp before ``start_ms``? (no stats: yes)"""
    try:
        low = json.loads(f.stats or "{}").get("minValues", {}).get(column)
    except ValueError:
        return True
    if low is None:
        return True
    return datetime.fromisoformat(str(low).replace("Z", "+00:00")).timestamp() * 1000 < start_ms


def late_in_files(files, location: TableLocation, start_ms: int, column: str = TIMESTAMP_COLUMN) -> dict:
    """Late rows of the staged ``files`` (which hold the ``timestamp`` column, as ``column``: its
    physical name under column mapping)."""
    records, oldest = 0, None
    for f in files:
        if not _may_be_late(f, start_ms, column):
            continue
        with location.fs.open_input_file(location.join(f.path)) as handle:
            values = pq.read_table(handle, columns=[column]).column(column)
        micros = pc.cast(pc.cast(values, pa.timestamp("us", tz="UTC")), pa.int64())
        late = pc.filter(micros, pc.less(micros, start_ms * 1000))
        if len(late):
            records += len(late)
            low = pc.min(late).as_py() // 1000
            oldest = low if oldest is None else min(oldest, low)
    return {"records": records, "oldest_ms": oldest}


def late_in_frame(df, start_ms: int) -> dict:
    """Late rows of a DataFrame with the source's ``timestamp`` column (one Spark pass)."""
    from airflow_eo.driver.decode import functions_for

    with functions_for(df) as F:
        late = df.where(F.col(TIMESTAMP_COLUMN) < F.timestamp_millis(F.lit(start_ms)))
        row = late.agg(F.count(F.lit(1)).alias("n"), F.min(F.unix_millis(F.col(TIMESTAMP_COLUMN))).alias("oldest")).first()
    return {"records": int(row["n"] or 0), "oldest_ms": row["oldest"]}


def late_records(files, location: TableLocation, arrow_schema: pa.Schema, start_ms: int, source,
                 column: str = TIMESTAMP_COLUMN) -> dict:
    """Late rows of an interval batch: from the staged files when they keep ``timestamp`` (as
    ``column`` in the files), else from the batch's ``source`` records."""
    if TIMESTAMP_COLUMN in arrow_schema.names:
        return late_in_files(files, location, start_ms, column)
    return late_in_frame(source, start_ms)
