"""Table locations on the local filesystem, and the S3 commit-safety rule (no store is contacted)."""

from __future__ import annotations

import os

import pyarrow.fs as pafs
import pytest

from airflow_eo.core.errors import ConfigError
from airflow_eo.table.storage import TableLocation, check_commit_safety, is_local
from airflow_eo.spec import normalize_table_uri


def test_local_uris_become_absolute_paths_and_remote_ones_stay(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert normalize_table_uri("orders/") == str(tmp_path / "orders")
    assert normalize_table_uri(f"file://{tmp_path}/orders/") == str(tmp_path / "orders")
    assert normalize_table_uri("s3://bucket/orders/") == "s3://bucket/orders"
    assert is_local("/data/orders") and is_local("file:///data/orders") and not is_local("s3://b/t")
    with pytest.raises(ConfigError, match="table_uri is empty"):
        normalize_table_uri("")


def test_paths_join_under_the_root_and_back(tmp_path):
    loc = TableLocation.of(str(tmp_path / "t"))
    assert isinstance(loc.fs, pafs.LocalFileSystem) and loc.root == str(tmp_path / "t")
    path = loc.join("b00000001-abc", "part-0.parquet")
    assert path == f"{tmp_path}/t/b00000001-abc/part-0.parquet"
    assert loc.relative(path) == "b00000001-abc/part-0.parquet"
    with pytest.raises(ValueError, match="is not under the table root"):
        loc.relative(f"{tmp_path}/other/part-0.parquet")
    with pytest.raises(ValueError):
        loc.relative(f"{tmp_path}/t2/part-0.parquet")  # a sibling sharing the prefix is not inside


def test_small_files_are_replaced_whole_and_listed(tmp_path):
    loc = TableLocation.of(str(tmp_path / "t"))
    marker = loc.join("_airflow_eo", "attempts", "a.json")
    assert loc.read_text(marker) is None and not loc.exists("_airflow_eo/attempts/a.json")
    loc.write_text(marker, "one")
    loc.write_text(marker, "two")
    assert loc.read_text(marker) == "two" and loc.exists("_airflow_eo/attempts/a.json")
    assert os.listdir(tmp_path / "t" / "_airflow_eo" / "attempts") == ["a.json"]  # no temporary left
    loc.write_text(loc.join("b00000001-x", "part-0.parquet"), "data")
    assert [i.base_name for i in loc.list_files(loc.join("_airflow_eo"))] == ["a.json"]
    assert sorted(i.base_name for i in loc.list_dirs(loc.root)) == ["_airflow_eo", "b00000001-x"]
    assert loc.list_files(loc.join("absent")) == [] and loc.list_dirs(loc.join("absent")) == []


def test_s3_commits_need_conditional_put_etag():
    check_commit_safety("s3://bucket/t", {"conditional_put": "etag"})
    check_commit_safety("s3a://bucket/t", {"AWS_CONDITIONAL_PUT": "ETag"})  # keys and values in any case
    check_commit_safety("/local/t", None)  # local and other stores commit atomically by themselves
    check_commit_safety("gs://bucket/t", None)


@pytest.mark.parametrize("options, cause", [
    (None, "conditional_put is None, not 'etag'"),
    ({"conditional_put": "none"}, "conditional_put is 'none'"),
    ({"conditional_put": "etag", "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}, "opts out of safe concurrent commits"),
    ({"conditional_put": "etag", "AWS_S3_LOCKING_PROVIDER": "dynamodb"}, "is ignored by deltalake 1.x"),
])
def test_unsafe_s3_settings_are_refused_with_their_cause(options, cause):
    with pytest.raises(ConfigError, match=cause) as err:
        check_commit_safety("s3://bucket/t", options)
    assert "refusing to commit to s3://bucket/t" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=cause):
        TableLocation.of("s3://bucket/t", options)  # checked before any filesystem is built


def test_an_s3_location_keeps_bucket_and_key_as_its_root():
    loc = TableLocation.of("s3://bucket/warehouse/orders/", {"conditional_put": "etag", "AWS_REGION": "eu-west-1",
                                                             "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    assert loc.uri == "s3://bucket/warehouse/orders" and loc.root == "bucket/warehouse/orders"
    assert isinstance(loc.fs, pafs.S3FileSystem) and loc.fs.region == "eu-west-1"
