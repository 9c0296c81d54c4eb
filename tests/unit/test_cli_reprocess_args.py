"""``airflow-eo reprocess`` before it touches anything: the batch named by run key or by offset
ranges (as ``airflow-eo status`` prints them), and bad input refused in one line."""

from __future__ import annotations

import pytest

from airflow_eo.cli import main, parser
from airflow_eo.core.errors import ConfigError
from airflow_eo.core.offsets import OffsetRange
from airflow_eo.loop.reprocess import parse_range


@pytest.mark.parametrize("text", ["orders[2] 100..250", "orders[2]:100-250", " orders[2] 100 .. 250 "])
def test_a_range_reads_as_status_prints_it(text):
    assert parse_range(text) == OffsetRange("orders", 2, 100, 250)
    assert parse_range(str(OffsetRange("orders", 2, 100, 250))) == OffsetRange("orders", 2, 100, 250)


@pytest.mark.parametrize("text", ["orders 100..250", "orders[2] 250..100", "orders[2] 7..7", "orders[x] 1..2", ""])
def test_a_malformed_range_is_refused_naming_the_form(text):
    with pytest.raises(ConfigError, match=r"TOPIC\[PARTITION\] START\.\.END"):
        parse_range(text)


def test_the_table_is_positional_and_the_batch_named_either_way():
    args = parser().parse_args(["reprocess", "/data/orders", "--ingest-id", "o", "--topics", "orders",
                                "--range", "orders[0] 0..5", "--range", "orders[1] 0..4"])
    assert args.table_uri == "/data/orders" and args.range == ["orders[0] 0..5", "orders[1] 0..4"]
    assert args.run_key is None and args.func.__name__ == "cmd_reprocess"


@pytest.mark.parametrize("choice", [[], ["--run-key", "k", "--range", "orders[0] 0..5"]])
def test_neither_or_both_ways_is_one_line_and_exit_2(choice, capsys, tmp_path):
    table = tmp_path / "orders"
    assert main(["reprocess", str(table), "--ingest-id", "o", "--topics", "orders", *choice]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "by --run-key KEY or by its --range options, not both" in err[0]
    assert not table.exists()
