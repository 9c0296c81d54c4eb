"""Where tables live: table URIs, their filesystem, and whether commits there are atomic.

Delta commits go through deltalake; everything else the project writes beside a table
(plan log, staged Parquet files, attempt markers) goes through ``pyarrow.fs`` so that
local paths and object stores behave the same.

Object stores: ``s3://`` tables take deltalake storage options (built from an Airflow
``aws`` connection by :mod:`airflow_eo.hooks.storage`) and must declare how
commits stay atomic (:func:`check_commit_safety`); other schemes deltalake and pyarrow
both understand (``gs://``, ``abfss://``…) have atomic put-if-absent natively.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow.fs as pafs

from airflow_eo.core.errors import ConfigError
from airflow_eo.spec import normalize_table_uri


S3_SCHEMES = ("s3", "s3a")


def is_local(table_uri: str) -> bool:
    return urlparse(table_uri).scheme in ("", "file")


@dataclass(frozen=True)
class TableLocation:
    """A table root as a pyarrow filesystem plus the root path inside it.

    >>> loc = TableLocation.of("/tmp/orders")
    >>> loc.join("_airflow_eo", "plans")
    '/tmp/orders/_airflow_eo/plans'
    """

    uri: str
    fs: pafs.FileSystem
    root: str

    @classmethod
    def of(cls, table_uri: str, storage_options: dict[str, str] | None = None) -> "TableLocation":
        uri = normalize_table_uri(table_uri)
        if is_local(uri):
            return cls(uri, pafs.LocalFileSystem(), uri)
        parsed = urlparse(uri)
        if parsed.scheme in S3_SCHEMES:
            check_commit_safety(uri, storage_options)
            return cls(uri, _s3_filesystem(storage_options or {}), f"{parsed.netloc}{parsed.path}")
        fs, root = pafs.FileSystem.from_uri(uri)
        return cls(uri, fs, root)

    def join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def relative(self, path: str) -> str:
        """Path of ``path`` relative to the table root (what Delta add actions hold)."""
        prefix = self.root.rstrip("/") + "/"
        if not path.startswith(prefix):
            raise ValueError(f"{path} is not under the table root {self.root}")
        return path[len(prefix):]

    def read_text(self, path: str) -> str | None:
        try:
            with self.fs.open_input_stream(path) as f:
                return f.read().decode()
        except FileNotFoundError:
            return None
        except OSError as exc:  # pyarrow maps S3 "no such key" to OSError
            if "does not exist" in str(exc) or "NoSuchKey" in str(exc):
                return None
            raise

    def exists(self, relative: str) -> bool:
        return self.fs.get_file_info(self.join(relative)).type != pafs.FileType.NotFound

    def write_text(self, path: str, text: str) -> None:
        """Write a small file so that readers see the old or the new content, never a part."""
        parent = path.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        if isinstance(self.fs, pafs.LocalFileSystem):
            tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"  # threads of one process write too
            with self.fs.open_output_stream(tmp) as f:
                f.write(text.encode())
            os.replace(tmp, path)
        else:  # object-store PUTs are atomic
            with self.fs.open_output_stream(path) as f:
                f.write(text.encode())

    def list_files(self, path: str) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
        return [i for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.File]

    def list_dirs(self, path: str) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(path, recursive=False, allow_not_found=True)
        return [i for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.Directory]


def _s3_filesystem(options: dict[str, str]) -> pafs.S3FileSystem:
    """Map deltalake's S3 storage options onto pyarrow's S3 filesystem."""
    lowered = {k.lower(): v for k, v in options.items()}
    endpoint = lowered.get("aws_endpoint_url") or lowered.get("endpoint_url") or lowered.get("aws_endpoint")
    scheme = "http" if lowered.get("aws_allow_http", "").lower() == "true" else "https"
    if endpoint and "://" in endpoint:
        scheme, endpoint = endpoint.split("://", 1)
    return pafs.S3FileSystem(
        access_key=lowered.get("aws_access_key_id"),
        secret_key=lowered.get("aws_secret_access_key"),
        session_token=lowered.get("aws_session_token"),
        region=lowered.get("aws_region", "us-east-1"),
        endpoint_override=endpoint,
        scheme=scheme,
    )


# -- S3: commit safety and credentials -------------------------------------------------

SAFE_CONDITIONAL_PUT = "etag"


def check_commit_safety(table_uri: str, storage_options: dict[str, str] | None) -> None:
    """Refuse an S3 table whose commits could silently overwrite each other.

    A Delta commit is "create ``_delta_log/N.json`` unless it exists". On S3 that needs
    conditional writes (``If-None-Match: *``). deltalake 1.x sends them by default, but a
    store that ignores the header (older MinIO/Ceph, some gateways) then overwrites a
    racing commit without an error, and exactly-once is gone. So the user must say the
    store supports them: ``conditional_put=etag``. ``AWS_S3_LOCKING_PROVIDER=dynamodb`` is
    refused too: deltalake 1.x ignores it (it logs "delta-rs **no longer** supports
    S3DynamoDBLogStores", delta-rs discussion #4482), so it would promise a lock that
    is not there.

    >>> check_commit_safety("s3://bucket/t", {"conditional_put": "etag"})
    >>> check_commit_safety("/tmp/t", None)
    """
    if urlparse(table_uri).scheme not in S3_SCHEMES:
        return
    lowered = {k.lower(): str(v).strip().lower() for k, v in (storage_options or {}).items()}
    problems = []
    if lowered.get("aws_s3_allow_unsafe_rename") == "true":
        problems.append("AWS_S3_ALLOW_UNSAFE_RENAME=true opts out of safe concurrent commits")
    if lowered.get("aws_s3_locking_provider"):
        problems.append("AWS_S3_LOCKING_PROVIDER is ignored by deltalake 1.x (no DynamoDB lock "
                        "is taken; see delta-rs discussion #4482)")
    conditional = lowered.get("conditional_put", lowered.get("aws_conditional_put"))
    if conditional != SAFE_CONDITIONAL_PUT:
        problems.append(f"conditional_put is {conditional!r}, not 'etag'")
    if problems:
        raise ConfigError(
            f"refusing to commit to {table_uri}: Delta commits on S3 are atomic only with "
            f"conditional writes, and this configuration does not guarantee them ({'; '.join(problems)}). "
            "Use a store that supports If-None-Match/If-Match (AWS S3, MinIO, Cloudflare R2) and "
            'set "conditional_put": "etag" in the storage options (the extras of the aws connection)'
        )
