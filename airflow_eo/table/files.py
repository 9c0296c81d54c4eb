"""A staged file: one Parquet file an attempt wrote, as its Delta add action and the commit metadata name it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StagedFile:
    """One Parquet file an attempt staged, with what its Delta add action needs."""

    path: str  # relative to the table root
    size: int
    modification_time: int  # epoch ms
    num_records: int
    stats: str  # Delta stats JSON
    partition_values: dict = field(default_factory=dict)  # column -> value, from its directory (partitioning)
