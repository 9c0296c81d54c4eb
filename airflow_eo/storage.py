"""Where tables live: one place that turns a table URI into a filesystem.

Delta commits go through deltalake; everything else the project writes beside a table
(plan log, staged Parquet files, attempt markers) goes through ``pyarrow.fs`` so that
local paths and object stores behave the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow.fs as pafs

from airflow_eo.errors import ConfigError


def normalize_table_uri(table_uri: str) -> str:
    """Absolute ``file://``-less path for local tables, the URI unchanged otherwise."""
    if not table_uri:
        raise ConfigError("table_uri is empty: pass a local path or an s3://… URI of the Delta table")
    parsed = urlparse(table_uri)
    if parsed.scheme in ("", "file"):
        return os.path.abspath(parsed.path if parsed.scheme == "file" else table_uri).rstrip("/")
    return table_uri.rstrip("/")


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
        if parsed.scheme in ("s3", "s3a"):
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

    def uri_of(self, relative: str) -> str:
        return f"{self.uri}/{relative}"

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

    def write_text(self, path: str, text: str) -> None:
        """Write a small file so that readers see the old or the new content, never a part."""
        parent = path.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        if isinstance(self.fs, pafs.LocalFileSystem):
            tmp = f"{path}.tmp-{os.getpid()}"
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
