"""What an option is (the metadata of a spec field) and how a raw value becomes its typed value.

A raw value is what a surface hands over: CLI text, a rendered Airflow template, a JSON value
read back from an attempt's record. Each parser names the option and the fix when it refuses.
No I/O.
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import MISSING, dataclass, field
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import urlparse

from airflow_eo.core.errors import ConfigError
from airflow_eo.core.intervals import parse_duration
from airflow_eo.core.planning import StartingPosition
from airflow_eo.spec.columns import LATEST, Format, format_of

# The columns that key every row to its source record: every file keeps them (with statistics)
KEY_COLUMNS = ("topic", "partition", "offset")
INTERNAL_PREFIX = "_airflow_eo_"  # columns airflow-eo adds while it works on a batch (never in a table)
DEFAULT_MAX_OFFSETS_PER_TASK = 1_000_000
# A direct batch this small is one Spark task anyway (airflow_eo.driver.source.MIN_OFFSETS_PER_TASK): the
# driver reads and stages it itself, without Spark's fixed costs (docs/performance.md)
DEFAULT_DRIVER_READ_MAX_OFFSETS = 100_000
# Staged files of an attempt whose marker is older than this (and whose process is gone) are orphans
DEFAULT_GRACE_SECONDS = 24 * 3600
# How long a run waits for its table's lease (another run of the table planning or committing)
DEFAULT_TABLE_WAIT_SECONDS = 15 * 60
# Expires Delta txn actions, i.e. a table's committed offsets: refused at creation and later.
TXN_RETENTION = "delta.setTransactionRetentionDuration"
FROM_EARLIEST = StartingPosition("earliest")  # starting_offsets' default
_INGEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class Cli(enum.Enum):
    """How an option is given on the command line."""

    VALUE = "value"  # --flag VALUE
    SWITCH = "switch"  # --flag (on)
    REPEAT = "repeat"  # --flag VALUE, repeatable


class OptionValue(str, enum.Enum):
    """An option's closed set of values: shown as the user writes them (``mode='interval'``)."""

    def __repr__(self) -> str:
        return repr(self.value)

    __str__ = str.__str__

    @classmethod
    def _parse(cls, value: Any, name: str, default: "OptionValue | None", what: str, hint: str) -> Any:
        """``value`` as a member (lower-cased; None or "" is ``default``), or a ConfigError naming
        the option, what it is not, and ``hint`` (what to use instead)."""
        if value in (None, ""):
            return default
        try:
            return cls(str(value).lower())
        except ValueError:
            raise ConfigError(f"{name}={value!r} is not {what}: use {hint}") from None


class Mode(OptionValue):
    """How a run chooses its records (:mod:`airflow_eo.loop.planner`)."""

    OFFSETS = "offsets"  # everything new since the last commit
    INTERVAL = "interval"  # the records of the run's data interval, by Kafka timestamp

    @classmethod
    def parse(cls, value: Any) -> "Mode":
        return cls._parse(value, "mode", cls.OFFSETS, "a planning mode", "'offsets' (everything new since the last commit, the "
                          "default) or 'interval' (the records of the run's data interval)")


class WriteMode(OptionValue):
    """How a batch lands in the table (:mod:`airflow_eo.driver.merge`)."""

    APPEND = "append"  # every record a row, keyed by source offset
    MERGE = "merge"  # one row per merge key: a record upserts or deletes its key's row

    @classmethod
    def parse(cls, value: Any) -> "WriteMode":
        return cls._parse(value, "write_mode", cls.APPEND, "a write mode", "'append' (every record a row, the default) or 'merge' "
                          "(one row per merge_key: upserts and deletes)")


class CdcFormat(OptionValue):
    """The envelope change events arrive in (:mod:`airflow_eo.driver.cdc`)."""

    DEBEZIUM = "debezium"

    @classmethod
    def parse(cls, value: Any) -> "CdcFormat | None":
        return cls._parse(value, "cdc_format", None, "supported", "'debezium' (or leave it unset for values that are rows "
                          "themselves)")


@dataclass(frozen=True)
class Option:
    """What the surfaces need to know about one option (a sub-spec field's metadata)."""

    name: str  # the operator's keyword, IngestConfig's keyword, README's row
    help: str  # one line: the CLI's help and README's meaning
    flag: str  # the CLI flag of `airflow-eo ingest` (and the standalone driver)
    cli: Cli = Cli.VALUE
    templated: bool = False  # listed in the operator's template_fields
    from_file: bool = False  # the CLI also takes "@file" (the value read from it)
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    parse: Callable[[Any], Any] | None = None  # a raw value (CLI text, rendered template, JSON) → the typed one
    dump: Callable[[Any], Any] | None = None  # the typed value → JSON (default: as it is)


def option(name: str, help: str, default: Any = MISSING, *, flag: str | None = None, factory: Any = MISSING,
           **meta: Any) -> Any:
    """A sub-spec field that is a user-facing option (``flag`` defaults to ``--<name>``)."""
    opt = Option(name, help, flag or "--" + name.replace("_", "-"), **meta)
    return field(default=default, default_factory=factory, metadata={"option": opt})


# -- parsing raw values (each names the option and the fix) --------------------------------------------
def text(value: Any) -> str | None:
    """Text, or None for nothing (an unset template renders as '')."""
    return None if value is None or value == "" else str(value)


def integer(value: Any) -> int | None:
    return None if value is None or value == "" else int(value)


def number(value: Any) -> float | None:
    return None if value is None or value == "" else float(value)


def switch(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def switch_on(value: Any) -> bool:
    """A switch that is on unless turned off: None or '' (an unset template) is on."""
    return True if value is None or value == "" else switch(value)


def topic_list(value: Any) -> tuple[str, ...]:
    parts = value.split(",") if isinstance(value, str) else list(value or ())
    topics = tuple(str(t).strip() for t in parts if str(t).strip())
    if not topics:
        raise ConfigError("topics is empty: name at least one Kafka topic, e.g. topics=['orders']")
    return topics


def topic_regex(value: Any) -> str | None:
    """A topic pattern: a regular expression Python compiles (Kafka's Java client matches a
    pattern against the whole topic name; so does :func:`re.fullmatch`)."""
    pattern = str(value).strip() if value is not None else ""
    if not pattern:
        return None
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"topic_pattern {pattern!r} is not a regular expression ({exc}): give one a topic name "
                          "fully matches, e.g. 'orders\\..*'") from None
    return pattern


def normalize_table_uri(table_uri: str) -> str:
    """Absolute ``file://``-less path for local tables, the URI unchanged otherwise."""
    if not table_uri:
        raise ConfigError("table_uri is empty: pass a local path or an s3://… URI of the Delta table")
    parsed = urlparse(table_uri)
    if parsed.scheme in ("", "file"):
        return os.path.abspath(parsed.path if parsed.scheme == "file" else table_uri).rstrip("/")
    return table_uri.rstrip("/")


def optional_table_uri(value: Any) -> str | None:
    return normalize_table_uri(str(value)) if value else None


def validate_ingest_id(ingest_id: str) -> str:
    if not isinstance(ingest_id, str) or not _INGEST_ID.match(ingest_id):
        raise ConfigError(
            f"ingest_id {ingest_id!r} is not valid: use 1-128 letters, digits, '.', '_' or '-' "
            "(it names the table's offsets in the Delta log, so keep it stable)"
        )
    return ingest_id


def column_names(option: str, value: Any, example: str) -> tuple[str, ...]:
    """An option naming columns of the transform's output: names, or comma-separated text
    (``--partition-by a,b``), as a tuple of distinct non-empty names; else a ConfigError."""
    items = [value] if isinstance(value, str) else list(value or ())
    names = tuple(c.strip() if isinstance(c, str) else c
                  for item in items for c in (item.split(",") if isinstance(item, str) else [item]))
    if not all(isinstance(name, str) and name for name in names):
        raise ConfigError(f"{option} {list(names)!r}: give column names of the transform's output, e.g. {example}")
    if len(set(names)) != len(names):
        raise ConfigError(f"{option} {list(names)!r} names a column twice")
    return names


def check_partition_by(columns: Iterable[str] | str | None) -> tuple[str, ...]:
    """``partition_by`` as a tuple of names, or a ConfigError naming what is wrong with them."""
    names = column_names("partition_by", columns, "['date']")
    for name in names:
        if name in KEY_COLUMNS:
            raise ConfigError(f"partition_by: {name!r} is a key column (topic, partition, offset), which every file "
                              "keeps; partition by a column the transform derives, e.g. to_date(timestamp) AS date")
    return names


def table_properties_of(value: Any) -> dict[str, str]:
    """A mapping, or ``KEY=VALUE`` texts (``--table-property``), as text keys and values."""
    if value is None or value == "":
        return {}
    if not isinstance(value, Mapping):
        bad = [v for v in value if not isinstance(v, str) or "=" not in v]
        if bad:
            raise ConfigError(f"table property {bad[0]!r} is not KEY=VALUE: write e.g. delta.checkpointInterval=50")
        value = dict(v.split("=", 1) for v in value)
    # numbers as their text (DAGs wrote {"delta.checkpointInterval": 10}); booleans as Delta spells them
    properties = {k: ("true" if v else "false") if isinstance(v, bool) else
                  str(v) if isinstance(v, (int, float)) else v for k, v in value.items()}
    check_table_properties(properties)
    return properties


def check_table_properties(properties: Mapping) -> None:
    """Delta table properties set when a batch creates the table: text keys and values, and
    never one that would expire the committed offsets."""
    for key, value in properties.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigError(f"table property {key!r}={value!r}: give keys and values as text, "
                              "e.g. {'delta.checkpointInterval': '50'}")
    if TXN_RETENTION in properties:
        raise ConfigError(f"table property {TXN_RETENTION} would expire the table's committed offsets (txn "
                          "actions) and make a later run duplicate records: leave it unset")


def starting_position(value: Any) -> StartingPosition:
    return StartingPosition.parse(None if value == "" else value)


def dump_starting_position(position: StartingPosition) -> Any:
    """The user-facing form: 'earliest', 'latest', {"timestamp": ms} or {"topic": {"0": 42}}."""
    if position.kind == "timestamp":
        return {"timestamp": position.timestamp_ms}
    if position.kind == "offsets":
        out: dict[str, dict[str, int]] = {}
        for tp, offset in sorted(position.offsets.items()):
            out.setdefault(tp.topic, {})[str(tp.partition)] = offset
        return out
    return position.kind


def enum_value(value: enum.Enum) -> str:
    return value.value


def optional_enum_value(value: enum.Enum | None) -> str | None:
    return None if value is None else value.value


def merge_key_of(value: Any) -> tuple[str, ...]:
    """``merge_key``: column names, or comma-separated text (``--merge-key id,tenant``)."""
    names = column_names("merge_key", value, "['id'] or --merge-key id,tenant")
    for name in names:
        if name in KEY_COLUMNS:
            raise ConfigError(f"merge_key: {name!r} is a provenance column (topic, partition, offset), which the "
                              "table keeps for the record that last wrote each row; key by a column of the data, "
                              "e.g. id")
        if name.startswith(INTERNAL_PREFIX):
            raise ConfigError(f"merge_key: {name!r} is a name airflow-eo uses itself; key by a column of the data")
    return names


def schema_version_of(value: Any) -> str:
    return LATEST if value in (None, "") else str(value)


def value_format_of(value: Any) -> Format:
    return format_of(value, Format.JSON)


def key_format_of(value: Any) -> Format:
    return format_of(value, Format.RAW)


def horizon_text(value: Any) -> str | None:
    return None if value in (None, "") else str(value)


def duration(value: Any) -> float:
    return parse_duration(None if value == "" else value)
