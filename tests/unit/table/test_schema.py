"""A batch's columns against the table's: refused when they differ (before anything is committed),
new ones added with schema evolution, and a reprocess's rows may lack the nullable columns added
after its batch (decoded with the batch's pinned reader schema)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_eo.core.errors import TableError
from airflow_eo.sinks.dead_letters import ensure_table
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.schema import check_schema, delta_schema_of

TABLE = pa.schema([("offset", pa.int64()), ("id", pa.int64()), ("tier", pa.string())])


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    ensure_table(str(tmp_path / "t"), TABLE)
    return Ledger.open(str(tmp_path / "t"))


def incoming(*fields) -> object:
    return delta_schema_of(pa.schema(list(fields)))


def test_a_batch_must_keep_every_column_and_type(ledger):
    assert check_schema(ledger, delta_schema_of(TABLE)) == []
    with pytest.raises(TableError, match=r"missing columns: \['tier'\]; new columns: none"):
        check_schema(ledger, incoming(("offset", pa.int64()), ("id", pa.int64())))
    with pytest.raises(TableError, match=r"changed types: \['id'\]"):
        check_schema(ledger, incoming(("offset", pa.int64()), ("id", pa.string()), ("tier", pa.string())))
    assert check_schema(ledger, incoming(*TABLE, ("note", pa.string())), schema_evolution=True) == ["note"]


def test_a_reprocess_may_lack_nullable_columns_but_not_add_or_retype_any(ledger, caplog):
    caplog.set_level("INFO", logger="airflow_eo")
    assert check_schema(ledger, incoming(("offset", pa.int64()), ("id", pa.int64())), replacing=True) == []
    assert "the reprocessed rows have no tier (null" in caplog.text
    with pytest.raises(TableError, match=r"new columns: \['note'\]"):
        check_schema(ledger, incoming(("offset", pa.int64()), ("id", pa.int64()), ("note", pa.string())),
                     replacing=True)
    with pytest.raises(TableError, match=r"changed types: \['id'\]"):
        check_schema(ledger, incoming(("offset", pa.int64()), ("id", pa.string())), replacing=True)


def test_a_column_that_cannot_be_null_is_never_left_out(tmp_path):
    ensure_table(str(tmp_path / "strict"), pa.schema([pa.field("offset", pa.int64(), nullable=False),
                                                      ("id", pa.int64())]))
    with pytest.raises(TableError, match=r"missing columns: \['offset'\]"):
        check_schema(Ledger.open(str(tmp_path / "strict")), incoming(("id", pa.int64())), replacing=True)
