"""Which transforms take the direct path (read tasks write the Parquet) and which need Spark."""

from __future__ import annotations

import pytest

from airflow_eo.driver.direct import projected_columns
from airflow_eo.driver.reader import KAFKA_SCHEMA
from airflow_eo.spec.parts import Transform


@pytest.mark.parametrize("sql, columns", [
    ("SELECT topic, partition, offset, value FROM source", ("topic", "partition", "offset", "value")),
    ("select `topic`,`partition`,`offset`,timestamp,key from `source`;", ("topic", "partition", "offset",
                                                                          "timestamp", "key")),
    ("\n  SELECT *\n  FROM source\n", tuple(KAFKA_SCHEMA.names)),
])
def test_bare_projections_of_the_kafka_columns_are_direct(sql, columns):
    assert projected_columns(Transform(sql=sql)) == columns


def test_no_transform_is_the_identity():
    assert projected_columns(Transform()) == tuple(KAFKA_SCHEMA.names)


@pytest.mark.parametrize("sql", [
    "SELECT topic, partition, offset, CAST(value AS STRING) AS body FROM source",
    "SELECT topic, partition, offset, value AS v FROM source",
    "SELECT topic, partition, offset, value FROM source WHERE value IS NOT NULL",
    "SELECT topic, partition, offset, Value FROM source",  # not spelled as the source spells it
    "SELECT topic, partition, offset, value, value FROM source",
    "SELECT topic, partition, offset -- the key\n, value FROM source",
    "SELECT topic, partition, offset, value FROM other",
    "SELECT DISTINCT topic, partition, offset FROM source",
])
def test_anything_else_needs_spark(sql):
    assert projected_columns(Transform(sql=sql)) is None


def test_a_callable_needs_spark():
    assert projected_columns(Transform(callable="pkg.mod:fn")) is None
