"""Fixtures of the scale suite: a Spark standalone cluster and a local S3 endpoint,
each started once per module on 127.0.0.1 and stopped by PID."""

from __future__ import annotations

import pytest

from airflow_eo.testing.s3 import MotoS3
from tests.system.scale.servers import SparkStandalone


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    with SparkStandalone(tmp_path_factory.mktemp("spark-standalone")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with MotoS3(tmp_path_factory.mktemp("moto")) as server:
        yield server
