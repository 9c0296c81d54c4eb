"""Column mapping: a table's logical column names and the physical names (and ids) its files use.

Under column mapping (``delta.columnMapping.mode`` ``name`` or ``id``, PROTOCOL.md "Column
Mapping") every column, nested ones too, has a physical name
(``delta.columnMapping.physicalName``) and an id (``delta.columnMapping.id``): data files hold the
physical names with the ids as Parquet field ids, and the log keeps statistics and partition values
by physical name. A rename changes only the logical name. :class:`ColumnNames` is that mapping for
one snapshot (identity for a table without column mapping; :attr:`airflow_eo.table.features.TableFeatures.names`,
:func:`airflow_eo.table.features.column_names_of`): writers give their columns physical
names and field ids (:meth:`ColumnNames.physical_arrow_schema`, and
:func:`airflow_eo.driver.writer.to_physical` on Spark), readers of the table's files and of its
add actions map them back (:func:`airflow_eo.table.files.read_columns`,
:func:`airflow_eo.table.files.add_actions_of`).

Example::

    >>> names = ColumnNames.of_schema("name", [{"name": "payload", "type": "string", "nullable": True,
    ...     "metadata": {"delta.columnMapping.id": 2, "delta.columnMapping.physicalName": "v"}}])
    >>> names.physical("payload"), names.logical("v"), names.physical("offset")
    ('v', 'payload', 'offset')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import pyarrow as pa

FIELD_ID = b"PARQUET:field_id"  # pyarrow's field metadata key for a Parquet field id
SPARK_FIELD_ID = "parquet.field.id"  # Spark's column metadata key for the same


@dataclass(frozen=True)
class MappedField:
    """One column: its logical name, physical name and id, and its nested fields (structs; the
    element of an array and the key/value of a map by ``element``/``key``/``value``)."""

    name: str
    physical: str
    id: int | None
    children: tuple["MappedField", ...] = ()

    def child(self, name: str) -> "MappedField | None":
        return next((c for c in self.children if c.name == name), None)


def _mapped(name: str, kind, meta: Mapping) -> MappedField:
    return MappedField(name, meta.get("delta.columnMapping.physicalName", name),
                       int(meta["delta.columnMapping.id"]) if "delta.columnMapping.id" in meta else None,
                       _children(kind))


def _children(kind) -> tuple[MappedField, ...]:
    if not isinstance(kind, dict):
        return ()
    if kind.get("type") == "struct":
        return tuple(_mapped(f["name"], f["type"], f.get("metadata") or {}) for f in kind["fields"])
    if kind.get("type") == "array":
        return (MappedField("element", "element", None, _children(kind["elementType"])),)
    if kind.get("type") == "map":
        return (MappedField("key", "key", None, _children(kind["keyType"])),
                MappedField("value", "value", None, _children(kind["valueType"])))
    return ()


@dataclass(frozen=True)
class ColumnNames:
    """A snapshot's column mapping (``mode`` none: every name is its own physical name)."""

    mode: str = "none"
    fields: tuple[MappedField, ...] = ()
    _by_logical: dict = field(default_factory=dict, repr=False, compare=False)
    _by_physical: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        self._by_logical.update({f.name: f for f in self.fields})
        self._by_physical.update({f.physical: f for f in self.fields})

    @classmethod
    def of_schema(cls, mode: str, fields: list[dict]) -> "ColumnNames":
        """From the mode and the Delta schema's JSON fields."""
        if mode not in ("name", "id"):
            return cls()
        return cls(mode, tuple(_mapped(f["name"], f["type"], f.get("metadata") or {}) for f in fields))

    @property
    def active(self) -> bool:
        return self.mode in ("name", "id")

    def physical(self, logical: str) -> str:
        found = self._by_logical.get(logical)
        return found.physical if found is not None else logical

    def logical(self, physical: str) -> str:
        found = self._by_physical.get(physical)
        return found.name if found is not None else physical

    def field(self, logical: str) -> MappedField | None:
        return self._by_logical.get(logical)

    def physical_names(self, logical) -> tuple[str, ...]:
        return tuple(self.physical(n) for n in logical)

    def physical_values(self, values: Mapping[str, str | None]) -> dict[str, str | None]:
        """Partition values keyed by logical column names as the log keeps them (by physical name)."""
        return {self.physical(k): v for k, v in values.items()}

    def as_dict(self) -> dict[str, str]:
        """logical → physical of the top-level columns (what travels to Spark tasks)."""
        return {f.name: f.physical for f in self.fields}

    def physical_arrow_schema(self, schema: pa.Schema) -> pa.Schema:
        """``schema`` (logical) as the files hold it: physical names and field ids, nested too."""
        if not self.active:
            return schema
        return pa.schema([_physical_field(f, self.field(f.name)) for f in schema])


def _physical_field(f: pa.Field, mapped: MappedField | None) -> pa.Field:
    if mapped is None:
        return f
    meta = dict(f.metadata or {})
    if mapped.id is not None:
        meta[FIELD_ID] = str(mapped.id).encode()
    return pa.field(mapped.physical, _physical_type(f.type, mapped), f.nullable, meta or None)


def _physical_type(kind: pa.DataType, mapped: MappedField) -> pa.DataType:
    if pa.types.is_struct(kind):
        return pa.struct([_physical_field(kind.field(i), mapped.child(kind.field(i).name))
                          for i in range(kind.num_fields)])
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        element = mapped.child("element")
        value = kind.value_field
        inner = _physical_type(value.type, element) if element is not None else value.type
        return pa.list_(pa.field(value.name, inner, value.nullable)) if pa.types.is_list(kind) else \
            pa.large_list(pa.field(value.name, inner, value.nullable))
    if pa.types.is_map(kind):
        key, item = mapped.child("key"), mapped.child("value")
        return pa.map_(_physical_type(kind.key_type, key) if key else kind.key_type,
                       _physical_type(kind.item_type, item) if item else kind.item_type)
    return kind


def without_metadata(kind):
    """A Delta type's JSON without its nested fields' metadata (column mapping's physical names and ids)."""
    if isinstance(kind, dict):
        return {k: without_metadata(v) for k, v in kind.items() if k != "metadata"}
    if isinstance(kind, list):
        return [without_metadata(v) for v in kind]
    return kind


def rename_columns(data, mapping: Mapping[str, str]):
    """``data`` (an Arrow table or record batch) with its columns renamed by ``mapping`` (others kept)."""
    if not mapping or not any(n in mapping for n in data.schema.names):
        return data
    return data.rename_columns([mapping.get(n, n) for n in data.schema.names])


def physical_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` (logical columns, in ``schema``'s order) under ``schema``'s physical names and field
    ids, nested fields too (structs, lists, maps): a zero-copy view, since the physical types differ
    from the logical ones only in their fields' names and metadata."""
    return pa.RecordBatch.from_arrays([c if c.type == f.type else c.view(f.type) for c, f in zip(batch.columns, schema)],
                                      schema=schema)
