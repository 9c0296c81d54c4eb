"""A table's protocol and metadata read into one typed value: which Delta features it uses, and
which of them this project honours for what it is about to do.

Other engines share the tables airflow-eo writes: they add CHECK constraints and NOT NULL
columns, turn on the change data feed, delete rows with deletion vectors, rename columns under
column mapping. The Delta protocol makes each a contract every writer keeps, and delta-rs'
``create_write_transaction`` (the commit path) checks none of them. So every run reads them
here, when it plans and before Spark starts (:meth:`TableFeatures.check`), and what the project
cannot honour for the run's :class:`TableUse` is refused in one line naming the feature and the
fix (:class:`~airflow_eo.core.errors.TableFeatureError`: no retry, nothing changed). What it honours,
the write paths ask here: the constraints to enforce (:attr:`TableFeatures.constraints`) and the
generated columns to compute (:attr:`TableFeatures.generated`).

Every feature name of the protocol's appendix (and the later ones) is in :data:`SUPPORT`; a name
this version does not know is refused (a writer must implement every feature a table lists).
The page ``docs/how-to/shared-tables.md`` is this matrix for users; a test builds a table with
each feature and checks both.

Example::

    >>> features = TableFeatures.of(None)      # no table yet: nothing to honour
    >>> features.check(TableUse.MERGE, "/data/t")
    >>> features.constraints
    ()
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Mapping

from airflow_eo.attempt import PinnedFeatures
from airflow_eo.core.errors import TableFeatureError
from airflow_eo.table.mapping import ColumnNames, without_metadata


class TableUse(enum.Enum):
    """What a run does to a table: what a feature is refused for."""

    APPEND = "append"  # adds rows (write_mode=append; the dead-letter table)
    DEDUP = "dedup"  # adds rows, reading the keys of the table's rows
    MERGE = "merge"  # adds, rewrites and removes rows (write_mode=merge)
    REPROCESS = "reprocess"  # replaces a committed batch's rows
    MAINTAIN = "maintain"  # vacuum, checkpoints, log cleanup
    COMPACT = "compaction"  # maintenance that rewrites files (dataChange=false): deltalake's OPTIMIZE, or
    # airflow-eo's own bin-packing under column mapping (airflow_eo.table.compaction)
    AUDIT = "audit"  # reads the table's rows

    @property
    def removes_rows(self) -> bool:
        return self in (TableUse.MERGE, TableUse.REPROCESS)


class Support(enum.Enum):
    SUPPORTED = "supported"
    REFUSED = "refused"


@dataclass(frozen=True)
class FeatureSupport:
    """One feature of the matrix: whether the project writes tables that use it, and how (or why not
    and what to do)."""

    name: str
    support: Support
    how: str


_ENGINE = "deltalake 1.6 (airflow-eo's commit engine) cannot write it"
_COPY = "ingest into a table without it (or drop the feature with the engine that added it)"

# the features deltalake refuses to commit to (verified: "Unsupported table features required"), and what they are
_ENGINE_REFUSES = {"allowColumnDefaults": "", "identityColumns": " (identity values)", "rowTracking": " (row ids)",
                   "domainMetadata": "", "clustering": " (liquid clustering)", "inCommitTimestamp": "",
                   "typeWidening": "", "typeWidening-preview": "", "vacuumProtocolCheck": "",
                   "icebergCompatV1": " (Iceberg metadata)", "icebergCompatV2": " (Iceberg metadata)",
                   "icebergWriterCompatV1": " (Iceberg metadata)", "variantShredding": "",
                   "variantShredding-preview": ""}

SUPPORT: dict[str, FeatureSupport] = {f.name: f for f in (
    FeatureSupport("appendOnly", Support.SUPPORTED,
                   "with delta.appendOnly=true appends proceed; merge and reprocess (they remove rows) are refused "
                   "before Spark starts; compaction (dataChange=false) is allowed"),
    FeatureSupport("invariants", Support.SUPPORTED,
                   "each column's (and struct field's) delta.invariants expression is checked on the Spark path (false "
                   "or null violates)"),
    FeatureSupport("checkConstraints", Support.SUPPORTED,
                   "every delta.constraints.<name> expression is checked on the Spark path (only true passes); a "
                   "violating record goes to the dead-letter table, else the batch fails"),
    FeatureSupport("generatedColumns", Support.SUPPORTED,
                   "a generated column the transform leaves out is computed by Spark (expr of its generation "
                   "expression, cast to the column's type as delta-spark stores it); one it gives is checked like a "
                   "constraint"),
    FeatureSupport("changeDataFeed", Support.SUPPORTED,
                   "appends need no change files (readers take inserts from the added files); with "
                   "delta.enableChangeDataFeed=true merge and reprocess commit through deltalake's MERGE, which "
                   "writes the change files of their inserts, update pre/post images and deletes"),
    FeatureSupport("columnMapping", Support.SUPPORTED,
                   "modes name and id: every write (append, dedup, merge, reprocess) gives each column its physical "
                   "name and id (Parquet field id; nested fields, lists and maps too), statistics and partition "
                   "values by physical name; a merge's or reprocess's copies of table files keep their names and "
                   "ids; on change-feed or deletion-vector tables deltalake's MERGE writes them so; every read of the "
                   "table's files and add actions maps them back (dedup, merge, reprocess, the audit). Compaction is "
                   "airflow-eo's own bin-packing (deltalake's OPTIMIZE refuses such tables; no Z-order; files with "
                   "deletion vectors stay as they are). Refused: schema evolution (deltalake 1.6 adds no column to "
                   "such a table: add it with the engine that manages the table)"),
    FeatureSupport("deletionVectors", Support.SUPPORTED,
                   "appends proceed; while files carry deletion vectors, merge and reprocess commit through "
                   "deltalake's MERGE (its removes name each file's vector: deleted rows stay deleted); dedup and the "
                   "audit read the table's files without the deleted rows, and the audit names them as deleted by "
                   "the commit that wrote the vector"),
    FeatureSupport("timestampNtz", Support.SUPPORTED, "a column type: the transform's TIMESTAMP_NTZ columns"),
    FeatureSupport("v2Checkpoint", Support.SUPPORTED,
                   "deltalake reads V2 checkpoints and writes classic ones, which the feature allows"),
    *(FeatureSupport(name, Support.REFUSED, f"{_ENGINE}{what}; {_COPY}") for name, what in _ENGINE_REFUSES.items()),
    *(FeatureSupport(name, Support.REFUSED, "commits go through the table's catalog, which airflow-eo does not talk "
                     "to; ingest into a path-based table") for name in ("catalogManaged", "catalogOwned-preview")),
    *(FeatureSupport(name, Support.SUPPORTED,
                     "nothing to honour while no column is of type variant (deltalake's set_table_properties adds "
                     "variantType to tables it alters); a variant column is refused: airflow-eo does not write "
                     "variant data") for name in ("variantType", "variantType-preview")),
)}

# The table properties that turn a feature on (besides ``delta.feature.<name>=supported``), and the
# features another one needs (Delta's PROTOCOL.md: row tracking and clustering write domain metadata)
_TURNED_ON_BY = {"rowTracking": "delta.enableRowTracking", "inCommitTimestamp": "delta.enableInCommitTimestamps",
                 "typeWidening": "delta.enableTypeWidening", "typeWidening-preview": "delta.enableTypeWidening",
                 "icebergCompatV1": "delta.enableIcebergCompatV1", "icebergCompatV2": "delta.enableIcebergCompatV2",
                 "deletionVectors": "delta.enableDeletionVectors", "changeDataFeed": "delta.enableChangeDataFeed",
                 "variantShredding": "delta.enableVariantShredding"}
_NEEDED_BY = {"domainMetadata": ("rowTracking", "clustering"), "vacuumProtocolCheck": ("catalogManaged",)}

# Protocols before table features (writer version < 7) imply features by version.
_BY_WRITER_VERSION = {2: ("appendOnly", "invariants"), 3: ("checkConstraints",),
                      4: ("changeDataFeed", "generatedColumns"), 5: ("columnMapping",), 6: ("identityColumns",)}
MAX_READER_VERSION, MAX_WRITER_VERSION = 3, 7


class ConstraintKind(enum.Enum):
    CHECK = "CHECK constraint"
    INVARIANT = "invariant"
    NOT_NULL = "NOT NULL column"
    GENERATED = "generated column"


@dataclass(frozen=True)
class Constraint:
    """A rule every new row must pass, as a Spark SQL boolean expression over the table's columns."""

    kind: ConstraintKind
    name: str  # the constraint's name; the column's for the others
    expression: str  # Spark SQL; the row passes only when it is true

    @property
    def reason(self) -> str:
        """The dead-letter reason of a row that fails it (names the constraint)."""
        if self.kind is ConstraintKind.NOT_NULL:
            return f"violates NOT NULL column {self.name}"
        return f"violates {self.kind.value} {self.name}: {self.expression}"


@dataclass(frozen=True)
class GeneratedColumn:
    name: str
    expression: str  # Spark SQL over the other columns
    type: str = "string"  # the column's Delta type as JSON: the computed value is cast to it, as delta-spark stores it


class ColumnMapping(enum.Enum):
    NONE = "none"
    NAME = "name"
    ID = "id"


@dataclass(frozen=True)
class TableFeatures:
    """What a table's protocol and metadata ask of its writers and readers."""

    reader_version: int = 1
    writer_version: int = 2
    reader_features: frozenset[str] = frozenset()
    writer_features: frozenset[str] = frozenset()
    properties: Mapping[str, str] = field(default_factory=dict)
    constraints: tuple[Constraint, ...] = ()  # CHECK, invariants, NOT NULL, given generated columns
    generated: tuple[GeneratedColumn, ...] = ()
    column_mapping: ColumnMapping = ColumnMapping.NONE
    identity_columns: tuple[str, ...] = ()
    default_columns: tuple[str, ...] = ()
    variant_columns: tuple[str, ...] = ()
    files_with_deletion_vectors: int = 0
    names: ColumnNames = field(default_factory=ColumnNames)  # logical ↔ physical (column mapping)
    fields: str = field(default="[]", compare=False, repr=False)  # the schema's fields, JSON (what was read)

    @classmethod
    def of(cls, table) -> "TableFeatures":
        """The features of a ``deltalake.DeltaTable``'s snapshot (None: no table yet, none)."""
        if table is None:
            return cls()
        protocol, metadata = table.protocol(), table.metadata()
        fields = json.loads(table.schema().to_json())["fields"]
        return cls.of_parts(protocol.min_reader_version, protocol.min_writer_version,
                            protocol.reader_features or (), protocol.writer_features or (),
                            dict(metadata.configuration), fields, _deletion_vector_files(table, protocol))

    @classmethod
    def of_parts(cls, reader_version: int, writer_version: int, reader_features, writer_features,
                 properties: dict[str, str], fields: list[dict], dv_files: int = 0) -> "TableFeatures":
        """From the protocol's and metadata's parts (``fields``: the schema's JSON fields).

        >>> f = TableFeatures.of_parts(1, 3, (), (), {"delta.constraints.pos": "id > 0"},
        ...     [{"name": "id", "type": "long", "nullable": False, "metadata": {}}])
        >>> [c.reason for c in f.constraints]
        ['violates CHECK constraint pos: id > 0', 'violates NOT NULL column id']
        """
        writer = frozenset(writer_features) if writer_version >= 7 else frozenset(
            name for version, names in _BY_WRITER_VERSION.items() if writer_version >= version for name in names)
        reader = frozenset(reader_features) if reader_version >= 3 else frozenset(
            ("columnMapping",) if reader_version >= 2 else ())
        checks = [Constraint(ConstraintKind.CHECK, key.split(".", 2)[2], value)
                  for key, value in sorted(properties.items()) if key.startswith("delta.constraints.")]
        generated, invariants, not_null, identity, defaults, variants = [], [], [], [], [], []
        for f in fields:
            meta, name = f.get("metadata") or {}, f["name"]
            if "delta.generationExpression" in meta:
                generated.append(GeneratedColumn(name, meta["delta.generationExpression"],
                                                 json.dumps(without_metadata(f["type"]))))
            if any(k.startswith("delta.identity.") for k in meta):
                identity.append(name)
            if "CURRENT_DEFAULT" in meta:
                defaults.append(name)
            if _has_variant(f["type"]):
                variants.append(name)
        for path, f in _struct_fields(fields):  # top-level columns and the fields of their structs
            meta, name = f.get("metadata") or {}, ".".join(path)
            if "delta.invariants" in meta:
                expression = json.loads(meta["delta.invariants"])["expression"]["expression"]
                invariants.append(Constraint(ConstraintKind.INVARIANT, name, expression))
            if not f.get("nullable", True):  # a nested field is null too where its struct is (delta-spark's rule)
                not_null.append(Constraint(ConstraintKind.NOT_NULL, name,
                                           f"{'.'.join(_quote(p) for p in path)} IS NOT NULL"))
        if "checkConstraints" not in writer:
            checks = []  # the property is honoured only where the protocol supports it
        if "invariants" not in writer:
            invariants = []
        mapping = _mapping_mode(writer, properties)
        return cls(reader_version, writer_version, reader, writer, dict(properties),
                   (*checks, *invariants, *not_null), tuple(generated) if "generatedColumns" in writer else (),
                   ColumnMapping(mapping), tuple(identity), tuple(defaults), tuple(variants), dv_files,
                   ColumnNames.of_schema(mapping, fields), json.dumps(fields))

    def pinned(self) -> PinnedFeatures:
        """What an attempt carries of them (:class:`airflow_eo.attempt.PinnedFeatures`).

        >>> f = TableFeatures.of_parts(1, 3, (), (), {"delta.constraints.pos": "id > 0"}, [])
        >>> TableFeatures.of_pinned(f.pinned()) == f
        True
        """
        return PinnedFeatures(self.reader_version, self.writer_version, tuple(sorted(self.reader_features)),
                              tuple(sorted(self.writer_features)), dict(self.properties), self.fields,
                              self.files_with_deletion_vectors)

    @classmethod
    def of_pinned(cls, pinned: PinnedFeatures) -> "TableFeatures":
        return cls.of_parts(pinned.reader_version, pinned.writer_version, pinned.reader_features,
                            pinned.writer_features, dict(pinned.properties), json.loads(pinned.fields),
                            pinned.files_with_deletion_vectors)

    # -- what is active ----------------------------------------------------------------------------
    def _on(self, prop: str, feature: str) -> bool:
        return feature in self.writer_features and self.properties.get(prop, "false").lower() == "true"

    @property
    def append_only(self) -> bool:
        return self._on("delta.appendOnly", "appendOnly")

    @property
    def change_data_feed(self) -> bool:
        return self._on("delta.enableChangeDataFeed", "changeDataFeed")

    @property
    def has_deletion_vectors(self) -> bool:
        return self.files_with_deletion_vectors > 0

    def engine_for(self, use: TableUse) -> bool:
        """Whether ``use``'s commit goes through deltalake's MERGE (:mod:`airflow_eo.table.engine_merge`):
        a commit that removes rows must write change files (change data feed) or name the deletion
        vectors of the files it rewrites, which airflow-eo's own file swap cannot."""
        return use.removes_rows and (self.change_data_feed or self.has_deletion_vectors)

    @property
    def enforced(self) -> bool:
        """Whether rows must pass checks before they are staged (constraints, generated columns)."""
        return bool(self.constraints or self.generated)

    # -- the one check ---------------------------------------------------------------------------
    def refusal(self, use: TableUse) -> str | None:
        """Why the table cannot be used for ``use`` (a feature and the fix), or None."""
        if self.reader_version > MAX_READER_VERSION or self.writer_version > MAX_WRITER_VERSION:
            return (f"protocol version {self.reader_version}/{self.writer_version} is newer than the Delta "
                    "protocol airflow-eo knows; upgrade airflow-eo or ingest into another table")
        listed = sorted(self.reader_features | self.writer_features)
        unknown = [name for name in listed if name not in SUPPORT]
        if unknown:
            return (f"{_features(unknown)} unknown to airflow-eo (a writer must honour every feature a table "
                    f"lists); {_COPY}")
        refused = [name for name in listed if SUPPORT[name].support is Support.REFUSED
                   and (name != "identityColumns" or self.writer_version >= 7)]
        if refused:
            how = SUPPORT[refused[0]].how if len({SUPPORT[n].how for n in refused}) == 1 else \
                f"{_ENGINE}; {_COPY}"
            return f"{_features([f'{n!r}{self._turned_on(n, listed)}' for n in refused], quoted=True)} not supported: {how}"
        if self.identity_columns:  # writer version 6 implies the feature; refused where a column uses it
            return (f"identity column(s) {', '.join(self.identity_columns)}: {SUPPORT['identityColumns'].how}")
        if self.default_columns:
            return f"default column(s) {', '.join(self.default_columns)}: {SUPPORT['allowColumnDefaults'].how}"
        if self.variant_columns:
            return (f"variant column(s) {', '.join(self.variant_columns)}: airflow-eo does not write variant data; "
                    f"{_COPY}")
        if use.removes_rows and self.append_only:
            return (f"delta.appendOnly=true: a {use.value} removes or rewrites rows, which an append-only table "
                    "forbids; append instead (write_mode='append'), or unset delta.appendOnly if the table may change")
        return None

    def _turned_on(self, name: str, listed: list[str]) -> str:
        """What turned feature ``name`` on, as far as the table says (a property, or a feature needing it)."""
        prop = _TURNED_ON_BY.get(name)
        if prop is not None and self.properties.get(prop, "").lower() == "true":
            return f" (turned on by {prop}=true)"
        by = [n for n in _NEEDED_BY.get(name, ()) if n in listed]
        if by:
            return f" (needed by {', '.join(map(repr, by))})"
        explicit = f"delta.feature.{name}"
        return f" ({explicit}={self.properties[explicit]})" if explicit in self.properties else ""

    def check(self, use: TableUse, table_uri: str) -> None:
        """Refuse ``use`` of the table at ``table_uri`` when a feature forbids it (one line, no retry)."""
        reason = self.refusal(use)
        if reason is not None:
            raise TableFeatureError(f"the Delta table at {table_uri} cannot be used for {use.value}: {reason}; "
                                    "nothing was changed")


def _features(names: list[str], quoted: bool = False) -> str:
    """'table feature 'x' is' or 'table features 'x', 'y' are' (one line naming each)."""
    shown = ", ".join(names if quoted else map(repr, names))
    return f"table feature {shown} is" if len(names) == 1 else f"table features {shown} are"


def matrix_markdown() -> str:
    """The feature matrix as the docs page shows it (``python -m airflow_eo.table.features``)."""
    rows = [f"| `{f.name}` | {f.support.value} | {f.how} |" for f in SUPPORT.values()]
    return "\n".join(["| feature | airflow-eo | how, or why not and what to do |", "|---|---|---|", *rows]) + "\n"


def _mapping_mode(writer: frozenset, properties: Mapping[str, str]) -> str:
    """The table's column mapping mode (honoured only where the protocol supports the feature)."""
    mode = properties.get("delta.columnMapping.mode", "none") if "columnMapping" in writer else "none"
    return mode if mode in ("name", "id") else "none"


def column_names_of(table) -> ColumnNames:
    """A ``deltalake.DeltaTable`` snapshot's column mapping alone (cheaper than :meth:`TableFeatures.of`)."""
    protocol = table.protocol()
    writer = frozenset(protocol.writer_features or ()) if protocol.min_writer_version >= 7 else frozenset(
        ("columnMapping",) if protocol.min_writer_version >= 5 else ())
    mode = _mapping_mode(writer, table.metadata().configuration)
    if mode == "none":
        return ColumnNames()
    return ColumnNames.of_schema(mode, json.loads(table.schema().to_json())["fields"])


def _struct_fields(fields: list[dict], parents: tuple[str, ...] = ()):
    """``(path, field)`` of every field reachable through structs only, as delta-spark reads a table's
    NOT NULL columns and invariants (a field inside an array or a map is no column it checks)."""
    for f in fields:
        path = (*parents, f["name"])
        yield path, f
        if isinstance(f["type"], dict) and f["type"].get("type") == "struct":
            yield from _struct_fields(f["type"]["fields"], path)


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _has_variant(kind) -> bool:
    if isinstance(kind, str):
        return kind == "variant"
    return any(_has_variant(kind.get(k)) for k in ("elementType", "keyType", "valueType") if k in kind) or \
        any(_has_variant(f["type"]) for f in kind.get("fields", ()))


def _deletion_vector_files(table, protocol) -> int:
    """How many of the snapshot's files carry a deletion vector (read only where the feature is on:
    deltalake materialises every vector to answer)."""
    if "deletionVectors" not in (protocol.reader_features or ()):
        return 0
    import pyarrow as pa

    return pa.RecordBatchReader.from_stream(table.deletion_vectors()).read_all().num_rows


if __name__ == "__main__":  # docs/how-to/shared-tables.md's matrix
    print(matrix_markdown(), end="")
