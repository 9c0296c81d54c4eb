"""IngestSpec: the one typed value that configures an ingest, composed of the sub-specs; the
registry of its options (by name) and its one generic to/from dict. No I/O.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Mapping

from airflow_eo.core.errors import ConfigError
from airflow_eo.spec.options import Option
from airflow_eo.spec.options import CdcFormat
from airflow_eo.spec.halves import SinkSpec, SourceSide
from airflow_eo.spec.parts import (
    DeadLetterSpec, DecodeSpec, DedupSpec, MergeSpec, PlanningSpec, SourceSpec, SparkSettings, TableSpec, Transform,
)


@dataclass(frozen=True)
class IngestSpec:
    """Everything that defines one ingest into one table (no secrets)."""

    table: TableSpec
    source: SourceSpec
    planning: PlanningSpec = field(default_factory=PlanningSpec)
    transform: Transform = field(default_factory=Transform)
    decode: DecodeSpec = field(default_factory=DecodeSpec)
    dead_letters: DeadLetterSpec = field(default_factory=DeadLetterSpec)
    dedup: DedupSpec = field(default_factory=DedupSpec)
    spark: SparkSettings = field(default_factory=SparkSettings)
    merge: MergeSpec = field(default_factory=MergeSpec)

    def __post_init__(self):
        if bool(self.source.topics) == bool(self.source.topic_pattern):
            raise ConfigError("give topics (a list) or topic_pattern (a regular expression), one of them: "
                              + ("both were given" if self.source.topics else "neither was given"))
        decode = self.decode.with_default_subjects(self.source.topics) if self.source.topics else self.decode
        object.__setattr__(self, "decode", replace(decode, tombstones=self.merge.enabled)
                           if decode.tombstones != self.merge.enabled else decode)
        self.sink  # noqa: B018 - built (and so its own rules checked) once, here
        if self.decode.enabled and not self.dead_letters.table_uri:
            raise ConfigError(
                "decoding (value_schema, Avro, max_value_bytes, key_format) needs a dead_letter_table_uri: set where "
                "undecodable records go (a Delta table path other than the main table)")
        self._check_merge()

    def _check_merge(self) -> None:
        """The rules between the sink's merging and the source's decoding."""
        merge, decode = self.merge, self.decode
        if merge.cdc_format is CdcFormat.DEBEZIUM:
            if decode.value_format == "raw":
                raise ConfigError("cdc_format='debezium' needs decoded values: value_format='json' with value_schema "
                                  "(the row's Spark DDL) or value_format='avro'")
            if decode.value_format == "json" and not decode.value_schema:
                raise ConfigError("cdc_format='debezium' with JSON values needs value_schema: the Spark DDL of the "
                                  "row Debezium's before/after carry, e.g. 'id INT, name STRING' (the envelope "
                                  "around it, with or without the schema/payload wrapper, is understood)")

    @classmethod
    def of(cls, **options: Any) -> "IngestSpec":
        """The spec from options by their names (raw values: parsed here). A sub-spec may also be
        given whole under its group name (``transform=Transform(sql=...)``)."""
        unknown = set(options) - set(OPTIONS) - set(GROUPS) - set(SETTINGS)
        if unknown:
            raise ConfigError(f"unknown ingest option(s) {', '.join(sorted(unknown))}: the options are "
                              f"{', '.join(OPTIONS)}")
        groups = {}
        for group, kind in GROUPS.items():
            if isinstance(options.get(group), kind):  # given whole
                groups[group] = options[group]
                continue
            values = {f.name: parse_option(f.metadata["option"], options[f.metadata["option"].name])
                      if "option" in f.metadata else options[f.name]
                      for f in fields(kind) if f.metadata.get("option", f).name in options}
            groups[group] = _build(kind, values)
        return cls(**groups)

    def value(self, name: str) -> Any:
        """The typed value of the option or sub-spec field called ``name``; a sub-spec by its group
        name (``transform``, also the callable's option, is the sub-spec: what callers always read)."""
        if name in GROUPS:
            return getattr(self, name)
        group, field_name = OPTIONS.get(name) or SETTINGS[name]
        return getattr(getattr(self, group), field_name)

    def replace(self, **options: Any) -> "IngestSpec":
        """This spec with some options changed (raw values, parsed and validated like :meth:`of`)."""
        groups: dict[str, Any] = {}
        changed: dict[str, dict[str, Any]] = {}  # a sub-spec's fields change together: its rules see them all
        for name, value in options.items():
            if name in GROUPS and isinstance(value, GROUPS[name]):
                groups[name] = value
                continue
            if name not in OPTIONS and name not in SETTINGS:
                raise ConfigError(f"unknown ingest option {name}: the options are {', '.join(OPTIONS)}")
            group, field_name = OPTIONS.get(name) or SETTINGS[name]
            changed.setdefault(group, {})[field_name] = parse_option(name, value) if name in OPTIONS else value
        for group, values in changed.items():
            groups[group] = replace(groups.get(group, getattr(self, group)), **values)
        return replace(self, **groups)

    # -- one generic to/from dict (the attempt's JSON) ---------------------------------------------
    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {group: _dump(getattr(self, group)) for group in GROUPS}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Mapping[str, Any]]) -> "IngestSpec":
        return cls(**{group: _load(kind, raw.get(group) or {}) for group, kind in GROUPS.items()})

    # -- the two halves: what is read, where it goes (airflow_eo.spec.halves) ---------------------------
    @property
    def source_side(self) -> SourceSide:
        """What this ingest reads."""
        return SourceSide(self.source, self.planning, self.decode, self.spark)

    @property
    def sink(self) -> SinkSpec:
        """The table this ingest writes (today its one sink)."""
        return SinkSpec(self.table, self.transform, self.dead_letters, self.dedup, self.merge)

    @property
    def sinks(self) -> tuple[SinkSpec, ...]:
        """Every table this ingest writes: one today (fan-out to several is not built yet)."""
        return (self.sink,)

    # -- convenience for the readers of the most used options --------------------------------------
    @property
    def table_uri(self) -> str:
        return self.table.table_uri

    @property
    def ingest_id(self) -> str:
        return self.table.ingest_id

    @property
    def topics(self) -> tuple[str, ...]:
        return self.source.topics


GROUPS: dict[str, type] = {"table": TableSpec, "source": SourceSpec, "planning": PlanningSpec, "transform": Transform,
          "decode": DecodeSpec, "dead_letters": DeadLetterSpec, "dedup": DedupSpec, "spark": SparkSettings,
          "merge": MergeSpec}


def _options_of(kind: type) -> list[tuple[Any, Option]]:
    return [(f, f.metadata["option"]) for f in fields(kind) if "option" in f.metadata]


# option name → (group, field name); the settings that are no option (yet) likewise, by field name
OPTIONS: dict[str, tuple[str, str]] = {opt.name: (g, f.name) for g, k in GROUPS.items() for f, opt in _options_of(k)}
SETTINGS: dict[str, tuple[str, str]] = {f.name: (g, f.name) for g, k in GROUPS.items() for f in fields(k)
                                        if "option" not in f.metadata}


def option_of(name: str) -> Option:
    group, field_name = OPTIONS[name]
    return next(f.metadata["option"] for f in fields(GROUPS[group]) if f.name == field_name)


def all_options() -> list[Option]:
    return [option_of(name) for name in OPTIONS]


def templated_options() -> tuple[str, ...]:
    return tuple(opt.name for opt in all_options() if opt.templated)


def default_of(opt: Option) -> Any:
    group, field_name = OPTIONS[opt.name]
    f = next(f for f in fields(GROUPS[group]) if f.name == field_name)
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else MISSING


def required(opt: Option) -> bool:
    return default_of(opt) is MISSING


def parse_option(opt: Option | str, value: Any) -> Any:
    """A raw value of an option as its typed value (None: not set, the default); a ConfigError
    names the option and the fix."""
    opt = option_of(opt) if isinstance(opt, str) else opt
    if value is None and not required(opt):
        return default_of(opt)
    if opt.parse is None:
        return value
    try:
        return opt.parse(value)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        hint = f"use one of {', '.join(opt.choices)}" if opt.choices else f"see `airflow-eo ingest --help` ({opt.flag})"
        raise ConfigError(f"{opt.name}={value!r} is not understood ({exc}): {hint}") from None


def dump_option(opt: Option, value: Any) -> Any:
    return opt.dump(value) if opt.dump is not None and value is not None else value


def _build(kind: type, values: dict[str, Any]) -> Any:
    missing = [f.metadata["option"].name for f in fields(kind) if "option" in f.metadata and f.name not in values
               and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ConfigError(f"missing required option(s) {', '.join(missing)}: give them (CLI "
                          f"{', '.join(option_of(m).flag for m in missing)})")
    return kind(**values)


def _dump(sub: Any) -> dict[str, Any]:
    out = {}
    for f in fields(sub):
        value = getattr(sub, f.name)
        opt = f.metadata.get("option")
        out[f.name] = dump_option(opt, value) if opt else value
    return out


def _load(kind: type, raw: Mapping[str, Any]) -> Any:
    """A sub-spec from its dict; keys it does not know are ignored (a newer writer's additions)."""
    values = {}
    for f in fields(kind):
        if f.name in raw:
            opt = f.metadata.get("option")
            values[f.name] = parse_option(opt, raw[f.name]) if opt else raw[f.name]
    return kind(**values)
