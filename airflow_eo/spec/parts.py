"""The sub-specs an ingest spec composes: table, source, planning, transform, decoding, dead letters,
dedup, Spark. Each user-facing field carries its :class:`~airflow_eo.spec.options.Option`. No I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import cached_property

from airflow_eo.core.errors import ConfigError
from airflow_eo.core.intervals import DEFAULT_CLOSE_AFTER_SECONDS, parse_duration
from airflow_eo.core.identity import OnTopicRecreated
from airflow_eo.core.planning import OnDataLoss, StartingPosition
from airflow_eo.spec.columns import (
    FORMATS, LATEST, SCHEMA_FORMATS, ColumnSpec, Format, Source, column_of, format_of, version_of,
)
from airflow_eo.spec.options import (
    DEFAULT_DRIVER_READ_MAX_OFFSETS, DEFAULT_GRACE_SECONDS, DEFAULT_MAX_OFFSETS_PER_TASK, DEFAULT_TABLE_WAIT_SECONDS,
    FROM_EARLIEST, TXN_RETENTION, CdcFormat, Cli, Mode, WriteMode,
    check_partition_by, check_table_properties, dump_starting_position, duration, enum_value, horizon_text, integer,
    key_format_of, merge_key_of, normalize_table_uri, number, option, optional_enum_value, optional_table_uri,
    schema_version_of, starting_position, switch, switch_on, table_properties_of, text, topic_list, topic_regex,
    validate_ingest_id, value_format_of,
)


@dataclass(frozen=True)
class TableSpec:
    """The Delta table and how a first batch creates it."""

    table_uri: str = option("table_uri", "the Delta table: a local path or an s3://… URI", flag="--table",
                            templated=True, parse=normalize_table_uri)
    ingest_id: str = option("ingest_id", "stable id of this ingest in the table's log (names its offsets); "
                            "operator default <dag_id>.<task_id>", templated=True, parse=validate_ingest_id)
    schema_evolution: bool = option("schema_evolution", "add new columns of the transform's output to the table",
                                    False, cli=Cli.SWITCH, parse=switch)
    table_properties: dict = option(
        "table_properties", "Delta properties of the table the first batch creates (an existing table keeps its "
        f"own); {TXN_RETENTION} is refused", flag="--table-property", factory=dict, cli=Cli.REPEAT,
        metavar="KEY=VALUE", templated=True, parse=table_properties_of)
    partition_by: tuple[str, ...] = option(
        "partition_by", "partition columns (produced by the transform, e.g. to_date(timestamp) AS date) of the "
        "table the first batch creates; an existing table must be named with its own", (), cli=Cli.REPEAT,
        metavar="COLUMN", templated=True, parse=check_partition_by, dump=list)
    adopt_table: bool = option(
        "adopt_table", "write into a Delta table created elsewhere (not by this ingest_id): its columns must accept "
        "the transform's output (a missing nullable column stays null), its other rows are left alone, offsets "
        "start at starting_offsets", False, cli=Cli.SWITCH, parse=switch)
    staging_grace_seconds: float = option(
        "staging_grace_seconds", "how long an attempt whose processes cannot be checked (another host) counts as "
        "running: runs wait for it and keep its staged files until then (seconds)", DEFAULT_GRACE_SECONDS, parse=float)
    table_wait_timeout: float = option(
        "table_wait_timeout", "how long a run waits for the table's lease while another run of the table plans, runs "
        "or commits (then it plans from the table as it is; seconds, or 90s/15m/1h)", DEFAULT_TABLE_WAIT_SECONDS,
        metavar="DURATION", parse=duration)

    def __post_init__(self):
        check_table_properties(self.table_properties)


@dataclass(frozen=True)
class SourceSpec:
    """The topics and where partitions never read start."""

    topics: tuple[str, ...] = option("topics", "Kafka topics (comma-separated or a list); or topic_pattern",
                                     (), templated=True, parse=topic_list, dump=list)
    topic_pattern: str | None = option(
        "topic_pattern", "instead of topics: a regular expression every topic read fully matches (as Kafka's Java "
        "client matches; internal topics never), resolved when a run plans: a topic created later is read from its "
        "start (into a table of its own under {topic}: from starting_offsets, that table's first batch)", None, templated=True, metavar="REGEX", parse=topic_regex)
    starting_offsets: StartingPosition = option(
        "starting_offsets", "where the partitions of the table's first batch start: earliest, latest, "
        '{"timestamp": ms} or {"topic": {"0": 42}} (-2 earliest, -1 latest); resolved once, committed with the '
        "first batch. A partition that appears later starts at its log start (unless named here)", FROM_EARLIEST,
        templated=True, parse=starting_position, dump=dump_starting_position)
    on_data_loss: OnDataLoss = option(
        "on_data_loss", "offsets deleted by retention before they were read: fail, or skip them (the gap is "
        "recorded in the commit)", OnDataLoss.FAIL, choices=tuple(m.value for m in OnDataLoss), parse=OnDataLoss,
        dump=enum_value)
    on_topic_recreated: OnTopicRecreated = option(
        "on_topic_recreated", "a topic deleted and created again since the table read it (another topic id, or "
        "its records' fingerprints changed): fail without retry, or reset: read it from the new topic's start (the "
        "reset is recorded in the commit)", OnTopicRecreated.FAIL, choices=tuple(m.value for m in OnTopicRecreated),
        parse=OnTopicRecreated, dump=enum_value)
    mirror_consumer_group: str | None = option(
        "mirror_consumer_group", "also commit the table's offsets to this consumer group, for lag tools (the Delta "
        "log stays the source of truth)", None, parse=text)


@dataclass(frozen=True)
class PlanningSpec:
    """How a run chooses its records."""

    mode: Mode = option("mode", "offsets: everything new since the last commit; interval: the records of the "
                        "run's data interval by Kafka timestamp (CLI: implied by --interval-start)", Mode.OFFSETS,
                        choices=tuple(m.value for m in Mode), templated=True, parse=Mode.parse, dump=enum_value)
    close_after: float = option("close_after", "interval mode: an idle partition closes this long after the "
                                "interval end (seconds, or 90s/15m/1h)", DEFAULT_CLOSE_AFTER_SECONDS,
                                metavar="DURATION", parse=duration)
    max_records_per_run: int | None = option(
        "max_records_per_run", "cap on the offsets one batch spans, split by max-min fairness over partitions",
        None, parse=integer)


@dataclass(frozen=True)
class Transform:
    """How Kafka records become the table's columns: Spark SQL over the view ``source``, or a
    callable ``"package.module:function"`` (DataFrame → DataFrame), or neither (identity).
    Applied in the driver by :func:`airflow_eo.driver.transforms.apply_transform`.

    >>> Transform(sql="SELECT topic, partition, offset FROM source").describe()
    'sql'
    """

    sql: str | None = option("transform_sql", "Spark SQL over the view `source` (must keep topic, partition, "
                             "offset)", None, templated=True, parse=text)
    callable: str | None = option("transform", "or a Python callable 'package.module:function' "
                                  "(DataFrame → DataFrame)", None, parse=text)

    filter: str | None = option("filter", "Spark SQL condition over the view `source` (the decoded records): only "
                                "the records it keeps reach the table (applied before transform_sql); a batch "
                                "it keeps nothing of still commits its offsets", None, templated=True, parse=text)

    def __post_init__(self):
        if self.sql and self.callable:
            raise ConfigError("give either transform_sql or transform (a 'module:function'), not both")
        if self.callable and ":" not in self.callable:
            raise ConfigError(f"transform {self.callable!r} must name a function as 'package.module:function'")

    def describe(self) -> str:
        return "sql" if self.sql else ("callable " + self.callable if self.callable else "identity")


@dataclass(frozen=True)
class DecodeSpec:
    """How keys and values are decoded before the transform: the options users set, and the one
    typed spec per column built from them (:attr:`value`, :attr:`key`: :mod:`airflow_eo.spec.columns`).

    ``value_format``: ``json`` (with ``value_schema``, Spark DDL, parsed into the column
    ``data``), ``avro``, ``protobuf`` or ``json_schema`` (Confluent wire format through the Schema
    Registry, reader schema ``value_subject`` at ``value_schema_version``; or plain values of the
    inline ``avro_schema``, ``protobuf_schema`` with ``message_name``, ``json_schema``)
    or ``raw`` (bytes as they are). ``key_format`` the same for the key, into ``key_data``
    (``key_schema`` for JSON, ``key_avro_schema`` / ``key_protobuf_schema`` / ``key_message_name`` /
    ``key_json_schema`` / ``key_subject`` / ``key_schema_version`` for the others). Records that do not
    decode (or that their JSON Schema refuses, unless ``json_schema_validation`` is off), or values
    larger than ``max_value_bytes``, become dead letters.

    >>> spec = DecodeSpec(value_format="avro", avro_schema='"long"', key_format="json", key_schema="id STRING")
    >>> spec.enabled, type(spec.value).__name__, type(spec.key).__name__, spec.key.target
    (True, 'InlineAvro', 'JsonColumn', 'key_data')
    """

    value_schema: str | None = option("value_schema", "Spark DDL of JSON values, e.g. 'id INT, name STRING': "
                                      "decoded into column `data`, undecodable records become dead letters",
                                      None, templated=True, parse=text)
    value_format: Format = option("value_format", "json (with value_schema), avro, protobuf or json_schema (a "
                                  "registry, or avro_schema / protobuf_schema / json_schema) or raw bytes", Format.JSON, choices=FORMATS, templated=True, parse=value_format_of,
                                  dump=enum_value)
    max_value_bytes: int | None = option("max_value_bytes", "values larger than this become dead letters", None,
                                         parse=integer)
    avro_schema: str | None = option("avro_schema", "inline Avro schema (JSON) of plain Avro values, instead of "
                                     "a registry", None, templated=True, from_file=True, parse=text)
    value_subject: str | None = option("value_subject", "registry subject of the values' reader schema (default "
                                       "<first topic>-value)", None, templated=True, parse=text)
    value_schema_version: str = option("value_schema_version", "version of the values' reader schema: latest "
                                       "(resolved when a batch is planned; its retries and reprocesses keep it) or a "
                                       "number", LATEST, templated=True, parse=schema_version_of)
    key_format: Format = option("key_format", "decode the key too, into column `key_data`: raw, json (with "
                                "key_schema), avro, protobuf or json_schema", Format.RAW, choices=FORMATS, templated=True,
                                parse=key_format_of, dump=enum_value)
    key_schema: str | None = option("key_schema", "Spark DDL of JSON keys", None, templated=True, parse=text)
    key_avro_schema: str | None = option("key_avro_schema", "inline Avro schema (JSON) of plain Avro keys", None,
                                         templated=True, from_file=True, parse=text)
    key_subject: str | None = option("key_subject", "registry subject of the keys' reader schema (default "
                                     "<first topic>-key)", None, templated=True, parse=text)
    key_schema_version: str = option("key_schema_version", "version of the keys' reader schema: latest or a number",
                                     LATEST, templated=True, parse=schema_version_of)
    protobuf_schema: str | None = option(
        "protobuf_schema", "inline .proto text of plain Protobuf values (no wire header), instead of a registry; "
        "imports of google/protobuf/*.proto only", None, templated=True, from_file=True, parse=text)
    message_name: str | None = option(
        "message_name", "the values' Protobuf message, by full name (package.Message), in the registry's or the "
        "inline schema (default: the file's first message)", None, templated=True, parse=text)
    json_schema: str | None = option("json_schema", "inline JSON Schema of plain JSON values (no wire header), "
                                     "instead of a registry", None, templated=True, from_file=True, parse=text)
    json_schema_validation: bool = option(
        "json_schema_validation", "json_schema values and keys: a record its JSON Schema refuses is a dead letter "
        "(true); false skips validation (faster; records are still decoded into the schema's columns)", True,
        metavar="BOOL", parse=switch_on)
    key_protobuf_schema: str | None = option("key_protobuf_schema", "inline .proto text of plain Protobuf keys",
                                             None, templated=True, from_file=True, parse=text)
    key_message_name: str | None = option("key_message_name", "the keys' Protobuf message (package.Message)", None,
                                          templated=True, parse=text)
    key_json_schema: str | None = option("key_json_schema", "inline JSON Schema of plain JSON keys", None,
                                         templated=True, from_file=True, parse=text)
    # no option: set by the spec for write_mode="merge", where a null value (a tombstone) is a
    # change (a delete, or a Debezium no-op), not an undecodable record
    tombstones: bool = False

    def __post_init__(self):
        for name, default in (("value_format", Format.JSON), ("key_format", Format.RAW)):
            if not isinstance(getattr(self, name), Format):  # built in code with text
                try:
                    object.__setattr__(self, name, format_of(getattr(self, name), default))
                except ValueError:
                    raise ConfigError(f"{name} {getattr(self, name)!r} is not supported: use one of "
                                      f"{', '.join(FORMATS)}") from None
        self.columns  # noqa: B018 - built (and so checked) once, here

    @cached_property
    def value(self) -> ColumnSpec:
        """How the value is decoded."""
        return column_of(Source.VALUE, self.value_format, ddl=self.value_schema,
                         schema=self._inline_schema(Source.VALUE, self.value_format),
                         subject=self.value_subject, version=_version(self.value_schema_version, Source.VALUE),
                         max_bytes=self.max_value_bytes, tombstones=self.tombstones, message_name=self.message_name,
                         validate=self.json_schema_validation)

    @cached_property
    def key(self) -> ColumnSpec:
        """How the key is decoded (never size-checked: ``max_value_bytes`` is about values)."""
        return column_of(Source.KEY, self.key_format, ddl=self.key_schema,
                         schema=self._inline_schema(Source.KEY, self.key_format),
                         subject=self.key_subject, version=_version(self.key_schema_version, Source.KEY),
                         message_name=self.key_message_name, validate=self.json_schema_validation)

    def _inline_schema(self, source: Source, format: Format) -> str | None:
        """The column's inline schema of its format; an inline schema of another format is refused."""
        found = None
        for kind, (_, name, _) in SCHEMA_FORMATS.items():
            option_name = source.option(name)
            given = getattr(self, option_name)
            if given and kind is not format:
                raise ConfigError(f"{option_name} is the inline schema of {source.option('value_format')}="
                                  f"{kind!r}, but {source.option('value_format')}={format!r}: set the format, or "
                                  f"leave {option_name} unset")
            if given:
                found = given
        return found

    @property
    def columns(self) -> tuple[ColumnSpec, ...]:
        """The value's spec and the key's, in the order their dead-letter reasons count."""
        return (self.value, self.key)

    def with_default_subjects(self, topics: tuple[str, ...]) -> "DecodeSpec":
        """Avro, Protobuf or JSON Schema read through a registry defaults to ``<first topic>-value`` / ``-key`` (Confluent's
        TopicNameStrategy); without one, no subject."""
        value, key = self.value.needs_registry, self.key.needs_registry
        return replace(self, value_subject=(self.value_subject or f"{topics[0]}-value") if value else None,
                       key_subject=(self.key_subject or f"{topics[0]}-key") if key else None)

    @property
    def enabled(self) -> bool:
        """Whether anything is decoded or checked (then undecodable records need a dead-letter table)."""
        return any(c.decodes or c.checked for c in self.columns)


def _version(value: str, source: Source) -> int | None:
    try:
        return version_of(value)
    except ValueError:
        raise ConfigError(f"{source.option('value_schema_version')} {value!r} is not 'latest' or a number") from None


@dataclass(frozen=True)
class DeadLetterSpec:
    """Where undecodable records go, and how many a batch may have before it fails."""

    table_uri: str | None = option("dead_letter_table_uri", "the Delta table undecodable records (and, if asked, "
                                   "duplicates) go to", None, flag="--dead-letter-table", templated=True,
                                   parse=optional_table_uri)
    max_count: int | None = option("max_dead_letters", "fail the run (committing nothing) above this many dead "
                                   "letters", None, parse=integer)
    max_fraction: float | None = option("max_dead_letter_fraction", "fail the run above this fraction of the "
                                        "batch as dead letters, e.g. 0.01", None, parse=number)

    def __post_init__(self):
        if self.max_fraction is not None and not 0 <= self.max_fraction <= 1:
            raise ConfigError("max_dead_letter_fraction must be between 0 and 1, e.g. 0.01 for 1 %")


@dataclass(frozen=True)
class DedupSpec:
    """Dedup by a producer-supplied key (:mod:`airflow_eo.driver.dedup`): ``key`` a Spark SQL
    expression over the source columns; ``horizon`` how far back the table is checked — a
    duration over the Kafka timestamp (``"1d"``, seconds) or ``"<n> batches"``; None: the whole
    table; ``to_dead_letters``: dropped records also go to the dead-letter table."""

    key: str | None = option("dedup_key", "drop records whose producer key (a Spark SQL expression over the "
                             "source, e.g. headers['event-id']) is already in the table or earlier in the batch",
                             None, metavar="EXPR", templated=True, parse=text)
    horizon: str | None = option("dedup_horizon", "how far back dedup_key looks: a duration over the Kafka "
                                 "timestamp (1d, 12h) or '<n> batches' (default: the whole table)", None,
                                 parse=horizon_text)
    to_dead_letters: bool = option("duplicates_to_dead_letters", "also write dropped duplicates to the dead-letter "
                                   "table (reason 'duplicate key')", False, cli=Cli.SWITCH, parse=switch)

    def __post_init__(self):
        if self.horizon is not None:
            self.horizon_batches()  # parse now, not on Spark
        if self.to_dead_letters and not self.key:
            raise ConfigError("duplicates_to_dead_letters needs a dedup_key")

    @property
    def enabled(self) -> bool:
        return bool(self.key)

    def horizon_batches(self) -> int | None:
        """``"<n> batches"`` → n; None for a duration or no horizon."""
        horizon = str(self.horizon or "").strip().lower()
        if horizon.endswith(("batches", "batch")):
            count = re.fullmatch(r"(\d+)\s*batch(?:es)?", horizon)
            if count is None or int(count.group(1)) < 1:
                raise ConfigError(f"dedup_horizon {self.horizon!r} is not understood: use a duration over the Kafka "
                                  "timestamp ('1d', '12h', seconds) or '<n> batches'")
            return int(count.group(1))
        if horizon:
            parse_duration(horizon)
        return None


# the delete rules when delete_when is not given: a tombstone; a Debezium delete event
TOMBSTONE_RULE = "value IS NULL"
DEBEZIUM_DELETE_RULE = "op = 'd'"


@dataclass(frozen=True)
class MergeSpec:
    """How a batch lands (:mod:`airflow_eo.driver.merge`): appended, every record a row keyed by
    source offset, or merged: one row per ``key`` (columns of the transform's output), a batch's
    last change of a key replacing or deleting its row. ``delete_when`` (Spark SQL over the source
    view, evaluated before the transform) says which records delete; ``cdc_format`` unwraps change
    events (Debezium) into the row they carry.

    >>> MergeSpec(WriteMode.MERGE, ("id",)).delete_rule
    'value IS NULL'
    >>> MergeSpec(WriteMode.MERGE, ("id",), cdc_format=CdcFormat.DEBEZIUM).delete_rule
    "op = 'd'"
    """

    write_mode: WriteMode = option(
        "write_mode", "append: every record a row, keyed by source offset; merge: one row per merge_key, "
        "records upsert or delete their key's row (the last change wins)", WriteMode.APPEND,
        choices=tuple(m.value for m in WriteMode), templated=True, parse=WriteMode.parse, dump=enum_value)
    key: tuple[str, ...] = option(
        "merge_key", "write_mode=merge: the key columns of the transform's output (comma-separated or a "
        "list); each key has at most one row", (), metavar="COLUMN[,COLUMN]", templated=True, parse=merge_key_of,
        dump=list)
    delete_when: str | None = option(
        "delete_when", f"write_mode=merge: Spark SQL boolean over the source columns (before the transform) that "
        f"makes a record delete its key's row (default {TOMBSTONE_RULE}; with cdc_format=debezium "
        f"{DEBEZIUM_DELETE_RULE})", None, metavar="EXPR", templated=True, parse=text)
    cdc_format: CdcFormat | None = option(
        "cdc_format", "values are change events: debezium (JSON with or without the schema/payload wrapper, or "
        "Avro); the transform sees the row's fields plus op and ts_ms", None,
        choices=tuple(c.value for c in CdcFormat), templated=True, parse=CdcFormat.parse, dump=optional_enum_value)

    def __post_init__(self):
        object.__setattr__(self, "write_mode", WriteMode.parse(self.write_mode))
        object.__setattr__(self, "cdc_format", CdcFormat.parse(self.cdc_format))
        if self.delete_when is not None and not str(self.delete_when).strip():
            object.__setattr__(self, "delete_when", None)
        if self.enabled and not self.key:
            raise ConfigError("write_mode='merge' needs merge_key: the key columns of the transform's output, "
                              "e.g. merge_key=['id'] (CLI --merge-key id)")
        if not self.enabled:
            given = [name for name, value in (("merge_key", self.key), ("delete_when", self.delete_when),
                                              ("cdc_format", self.cdc_format)) if value]
            if given:
                raise ConfigError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only with "
                                  "write_mode='merge' (one row per key): set write_mode='merge', or leave "
                                  f"{'it' if len(given) == 1 else 'them'} unset to append every record")

    @property
    def enabled(self) -> bool:
        return self.write_mode is WriteMode.MERGE

    @property
    def delete_rule(self) -> str:
        """The Spark SQL condition under which a record deletes its key's row."""
        if self.delete_when:
            return self.delete_when
        return DEBEZIUM_DELETE_RULE if self.cdc_format is CdcFormat.DEBEZIUM else TOMBSTONE_RULE


@dataclass(frozen=True)
class SparkSettings:
    """Settings of the attempt's Spark job that are not Spark conf."""

    max_offsets_per_task: int = option("max_offsets_per_task", "offsets one Spark task reads at most: a batch's "
                                       "ranges are cut into slices of this size", DEFAULT_MAX_OFFSETS_PER_TASK, parse=int)
    driver_read_max_offsets: int = option(
        "driver_read_max_offsets", "a batch of at most this many offsets whose rows Spark need not see (no "
        "decoding, dedup or merge; no transform, or a list of Kafka columns) is read and staged by the driver "
        "itself: no Spark job (a spark-submit driver starts no SparkContext, a Connect client runs no job on "
        "the server); 0: always Spark tasks", DEFAULT_DRIVER_READ_MAX_OFFSETS, parse=int)

    def __post_init__(self):
        if self.max_offsets_per_task <= 0:
            raise ConfigError(f"max offsets per Spark task must be positive, got {self.max_offsets_per_task}")
        if self.driver_read_max_offsets < 0:
            raise ConfigError(f"driver_read_max_offsets must be 0 (always Spark tasks) or positive, got "
                              f"{self.driver_read_max_offsets}")
