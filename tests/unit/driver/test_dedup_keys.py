"""Dedup keys over record headers: the expression rewrite, without Spark."""

from __future__ import annotations

from airflow_eo.driver.dedup import header_expression


def test_the_header_rewrite_leaves_literals_and_fields_alone():
    lookup = "try_element_at(filter(headers, h -> h.key = 'event-id'), -1).value"
    assert header_expression("HEADERS [ 'event-id' ]") == lookup
    assert header_expression("concat('headers[''x'']', s.headers['y'], `headers['z']`)") == \
        "concat('headers[''x'']', s.headers['y'], `headers['z']`)"
    assert header_expression("headers[0].value") == "headers[0].value"
