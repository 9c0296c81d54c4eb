"""FanOutSpec: one source, several sinks (tables). No I/O.

An ingest reads its topics once and writes each sink's table: each sink is given by its own options
(the single-table option names: ``table_uri``, ``write_mode``, ``merge_key``, ``transform_sql``,
``filter``, ``partition_by``, ``dead_letter_table_uri``, …, and ``topics``, a subset of the source's),
laid over the options shared by all of them. :meth:`FanOutSpec.tables` turns it into one ordinary
single-table :class:`~airflow_eo.spec.IngestSpec` per table: every table keeps its own offsets, plan
log, lease and history, so ``status``, ``audit`` and ``reprocess`` work on it as on any table.

Routing: a sink's ``table_uri`` (and ``dead_letter_table_uri``) may hold ``{topic}``: one table per
topic of the sink, including the topics a ``topic_pattern`` matches later (their tables are created
by their first batch). Without ``sinks`` the spec is the one table of the flat options.

What stays the source's (one read serves every sink): decoding, planning (mode, interval, caps),
Spark settings, ``on_data_loss``. What a sink may set: its table's options, its transform and filter,
its write mode, dedup and dead letters, ``topics``, ``starting_offsets`` (a sink added later starts
there) and ``mirror_consumer_group``.

Example::

    >>> spec = FanOutSpec.of(ingest_id="events", topics="clicks,views", sinks=[
    ...     {"table_uri": "/lake/raw"},
    ...     {"table_uri": "/lake/by_topic/{topic}", "transform_sql": "SELECT topic, partition, offset FROM source"},
    ...     {"table_uri": "/lake/latest", "topics": ["views"], "write_mode": "merge", "merge_key": "key"}])
    >>> [(t.table_uri, t.topics) for t in spec.tables(spec.topics)]  # doctest: +NORMALIZE_WHITESPACE
    [('/lake/by_topic/clicks', ('clicks',)), ('/lake/by_topic/views', ('views',)),
     ('/lake/latest', ('views',)), ('/lake/raw', ('clicks', 'views'))]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from airflow_eo.core.errors import ConfigError
from airflow_eo.spec.ingest import GROUPS, OPTIONS, IngestSpec
from airflow_eo.spec.options import CdcFormat, topic_list

TOPIC = "{topic}"  # in a sink's table URIs: one table per topic
# Kafka's internal topics: a pattern never matches them (as Kafka's Java client excludes them)
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
_SINK_GROUPS = ("table", "transform", "dead_letters", "dedup", "merge")
# the options one sink may set: its table's and what happens to a batch in it, its topics and where they start
SINK_OPTIONS = frozenset({name for name, (group, _) in OPTIONS.items() if group in _SINK_GROUPS}
                         | {"topics", "starting_offsets", "mirror_consumer_group"})
_TEMPLATED = ("table_uri", "dead_letter_table_uri")


def fans_out(options: Mapping[str, Any]) -> bool:
    """Whether an ingest of these options (the operator's arguments) may write several tables: ``sinks``,
    the topics of a pattern, or a table per topic (``{topic}`` in a table URI). Else it is the
    single-table form, whose result, preview and Asset are that one table's.

    >>> fans_out({"table_uri": "/t", "topics": "a"}), fans_out({"table_uri": "/t/{topic}", "topics": "a,b"})
    (False, True)
    """
    return options.get("sinks") is not None or bool(options.get("topic_pattern")) or \
        any(TOPIC in str(options.get(k) or "") for k in _TEMPLATED)


def matching_topics(pattern: str, topics: Sequence[str]) -> tuple[str, ...]:
    """The topics ``pattern`` fully matches, internal ones never, sorted.

    >>> matching_topics(r"orders\\..*", ["orders.eu", "orders", "__consumer_offsets", "orders.us"])
    ('orders.eu', 'orders.us')
    """
    regex = re.compile(pattern)
    return tuple(sorted(t for t in topics if t not in INTERNAL_TOPICS and regex.fullmatch(t)))


@dataclass(frozen=True)
class FanOutSpec:
    """The options every sink shares and each sink's own (raw values, by the options' names)."""

    shared: Mapping[str, Any]
    sinks: tuple[Mapping[str, Any], ...]

    @classmethod
    def of(cls, *, sinks: Sequence[Mapping[str, Any]] | None = None, **options: Any) -> "FanOutSpec":
        """The spec from the operator's arguments; everything that can be checked before a run is
        (a ConfigError names the sink and the fix)."""
        options = {k: v for k, v in options.items() if v is not None}
        if sinks is None:
            spec = cls(MappingProxyType(options), (MappingProxyType({}),))
        else:
            if not sinks:
                raise ConfigError("sinks is empty: give at least one sink, e.g. sinks=[{'table_uri': '/lake/t'}]")
            if "table_uri" in options:
                raise ConfigError("with sinks, each sink names its table: move table_uri into the sinks")
            spec = cls(MappingProxyType(options), tuple(MappingProxyType(dict(_check_sink(i, s)))
                                                        for i, s in enumerate(sinks)))
        spec.check()
        return spec

    @property
    def topics(self) -> tuple[str, ...]:
        """The topics given (none with a pattern)."""
        return topic_list(self.shared["topics"]) if self.shared.get("topics") else ()

    @property
    def topic_pattern(self) -> str | None:
        return self.shared.get("topic_pattern") or None

    @property
    def one_table(self) -> bool:
        """The single-table form: the flat options of one table (no sinks, pattern or ``{topic}``)."""
        return not fans_out({**self.shared, "sinks": None if self.sinks == ({},) else self.sinks})

    def check(self) -> None:
        """Build every table of a stand-in topic list: each sink's options are checked as a
        single table's; no two sinks write one table; one read decodes for every sink."""
        given = self.topics
        if bool(given) == bool(self.topic_pattern):
            raise ConfigError("give topics (a list) or topic_pattern (a regular expression), one of them: "
                              + ("both were given" if given else "neither was given"))
        for i, sink in enumerate(self.sinks):
            if given and sink.get("topics"):
                unknown = set(topic_list(sink["topics"])) - set(given)
                if unknown:
                    raise ConfigError(f"sink {i + 1} reads topic(s) {', '.join(sorted(unknown))} the ingest does not: "
                                      f"a sink's topics are some of the ingest's topics ({', '.join(given)})")
        tables = self.tables(given or ("topic_a", "topic_b"))
        uris = [t.table_uri for t in tables] + [t.dead_letters.table_uri for t in tables if t.dead_letters.table_uri]
        if len(set(uris)) != len(uris):
            raise ConfigError("two sinks write the same table (or dead-letter table): give each sink its own "
                              "table_uri and dead_letter_table_uri (or '{topic}' in them)")
        mirrored: dict[tuple[str, str], str] = {}
        for t in tables:  # two tables mirroring one topic into one group would overwrite each other's offsets
            group = t.source.mirror_consumer_group
            for topic in t.topics if group else ():
                other = mirrored.setdefault((str(group), topic), t.table_uri)
                if other != t.table_uri:
                    raise ConfigError(
                        f"the tables {other} and {t.table_uri} both mirror their offsets of topic {topic!r} to "
                        f"consumer group {group!r}: each would overwrite the other's; give each sink its own "
                        "mirror_consumer_group (or set it on one sink only)")
        debezium = {t.merge.cdc_format is CdcFormat.DEBEZIUM for t in tables if t.decode.enabled}
        if len(debezium) > 1:
            raise ConfigError("sinks of one ingest read its records decoded alike: a cdc_format='debezium' sink "
                              "cannot share its ingest with sinks of plain decoded values; give it its own ingest")

    def tables(self, topics: Sequence[str]) -> tuple[IngestSpec, ...]:
        """One single-table spec per table, in table_uri order, for the source's ``topics`` (the
        given ones, or what the pattern matches now). A sink none of whose topics exist yet has no table."""
        base = {k: v for k, v in self.shared.items() if k not in ("topics", "topic_pattern")}
        subjects = _subjects(self.shared, tuple(topics)) if topics else {}
        out: list[IngestSpec] = []
        for i, sink in enumerate(self.sinks):
            routed = any(TOPIC in str({**base, **sink}.get(k) or "") for k in _TEMPLATED)
            # a table per topic decodes by its topic's registry subjects; a table of several topics by the source's
            options = {**base, **sink} if routed else {**base, **subjects, **sink}
            own = tuple(t for t in topic_list(sink["topics"]) if t in topics) if sink.get("topics") else tuple(topics)
            if not own:
                continue
            try:
                if routed:
                    out.extend(IngestSpec.of(**{**options, "topics": [topic],
                                                **{k: str(options[k]).replace(TOPIC, topic)
                                                   for k in _TEMPLATED if options.get(k)}}) for topic in own)
                else:
                    out.append(IngestSpec.of(**{**options, "topics": list(own)}))
            except ConfigError as exc:
                raise ConfigError(f"sink {i + 1} ({sink.get('table_uri') or base.get('table_uri')}): {exc}") from None
        return tuple(sorted(out, key=lambda t: t.table_uri))

    def to_dict(self) -> dict[str, Any]:
        """The operator's arguments this spec was made of (``sinks`` a list of objects; none for the
        one table of flat options)."""
        if self.sinks == ({},):
            return dict(self.shared)
        return {**self.shared, "sinks": [dict(s) for s in self.sinks]}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "FanOutSpec":
        return cls.of(**raw)


def _check_sink(index: int, sink: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(sink, Mapping):
        raise ConfigError(f"sink {index + 1} is a {type(sink).__name__}: give each sink as an object of its options")
    unknown = set(sink) - SINK_OPTIONS
    if unknown:
        source_side = sorted(unknown & (set(OPTIONS) | set(GROUPS)))
        hint = (f"{', '.join(source_side)} belong(s) to the source: set them once, beside sinks" if source_side else
                f"a sink takes {', '.join(sorted(SINK_OPTIONS))}")
        raise ConfigError(f"sink {index + 1} has option(s) {', '.join(sorted(unknown))} no sink takes: {hint}")
    if not sink.get("table_uri"):
        raise ConfigError(f"sink {index + 1} has no table_uri: give each sink the Delta table it writes")
    return sink


def _subjects(shared: Mapping[str, Any], topics: tuple[str, ...]) -> dict[str, Any]:
    """The registry subjects the source decodes with, defaulted from its first topic as a single
    table's are (Confluent's TopicNameStrategy): the tables of several topics decode alike (a table
    per topic defaults to its own topic's subjects; the read then decodes each topic by its own)."""
    own = {k: v for k, v in shared.items() if OPTIONS.get(k, ("",))[0] == "decode"}
    decode = IngestSpec.of(**own, topics=list(topics), table_uri="/fan-out/t", ingest_id="subjects",
                           dead_letter_table_uri="/fan-out/dead-letters").decode
    return {name: value for name, value in (("value_subject", decode.value_subject),
                                            ("key_subject", decode.key_subject)) if value}
