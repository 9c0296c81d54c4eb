"""The commit engine underneath the compare-and-set commit: what deltalake itself detects."""

import pytest
from deltalake import DeltaTable


def test_deltalake_conflict_detection_on_txn_app_ids(tmp_path):
    """What delta-rs catches by itself: same txn appId from one snapshot conflicts;
    disjoint appIds are rebased and both land (hence every batch writes every txn)."""
    import pyarrow as pa
    from deltalake import write_deltalake
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import CommitProperties, Transaction

    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"x": [1]}))
    a, b = DeltaTable(uri), DeltaTable(uri)
    schema = a.schema()
    a.create_write_transaction([], "append", schema, commit_properties=CommitProperties(app_transactions=[Transaction("p0", 10)]))
    with pytest.raises(CommitFailedError):
        b.create_write_transaction([], "append", schema, commit_properties=CommitProperties(app_transactions=[Transaction("p0", 10)]))
    c = DeltaTable(uri)
    d = DeltaTable(uri)
    c.create_write_transaction([], "append", schema, commit_properties=CommitProperties(app_transactions=[Transaction("p1", 5)]))
    d.create_write_transaction([], "append", schema, commit_properties=CommitProperties(app_transactions=[Transaction("p2", 5)]))
    final = DeltaTable(uri)
    assert (final.transaction_version("p1"), final.transaction_version("p2")) == (5, 5)
