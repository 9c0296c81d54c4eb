"""Every surface names exactly the spec's options: the CLI, the standalone job, the operator, the docs
(docs/reference/options.md).

Adding an option is a field in :mod:`airflow_eo.spec` (plus its use); these tests fail when a
surface misses one, or names one the spec does not have.
"""

from __future__ import annotations

import argparse
import inspect
import re
from pathlib import Path

import pytest

from airflow_eo import cli
from airflow_eo.driver.main import job_parser
from airflow_eo.spec import OPTIONS, Cli, all_options, options_from_args, options_table, templated_options

OPTIONS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "options.md"

# what each surface has of its own: connections, Spark, secrets, run identity (no spec option)
CLI_OWN = {"help", "spec", "bootstrap_servers", "kafka_config", "master", "remote", "conf", "run_key", "storage_options",
           "schema_registry", "interval_start", "interval_end", "json"}
REPROCESS_OWN = {"help", "bootstrap_servers", "kafka_config", "master", "remote", "conf", "run_key", "range",
                 "request_key", "storage_options", "schema_registry", "json", "spec", "table"}
JOB_OWN = {"help", "table_uri", "attempt_id", "run_key"}
OPERATOR_OWN = {"kafka_conn_id", "spark_conn_id", "spark_conf", "spark_env_vars", "spark_hook_kwargs", "reprocess",
                "reprocess_run_id", "reprocess_dag_id", "storage_conn_id", "storage_options",
                "schema_registry_conn_id", "asset", "deferrable", "poll_interval", "sinks"}


def ingest_parser(command: str = "ingest") -> argparse.ArgumentParser:
    sub = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def reprocess_parser() -> argparse.ArgumentParser:
    return ingest_parser("reprocess")


def flags_of(parser: argparse.ArgumentParser) -> dict[str, str]:
    """dest → the long flag, for every flag of ``parser``."""
    return {a.dest: max(a.option_strings, key=len) for a in parser._actions if a.option_strings}


@pytest.mark.parametrize("parser, own", [(ingest_parser, CLI_OWN), (reprocess_parser, REPROCESS_OWN),
                                         (job_parser, JOB_OWN)], ids=["cli", "cli-reprocess", "job"])
def test_the_command_lines_have_a_flag_for_each_option_and_no_other(parser, own):
    flags = flags_of(parser())
    # the table is positional in `reprocess TABLE` and named --table-uri by the job
    expected = {o.name: o.flag for o in all_options() if not (parser is not ingest_parser and o.name == "table_uri")}
    assert {d: f for d, f in flags.items() if d not in own} == expected


def test_a_cli_flag_reaches_the_spec_with_the_options_name():
    argv = ["ingest"]
    for opt in all_options():
        argv += [opt.flag] if opt.cli is Cli.SWITCH else [opt.flag, opt.choices[0] if opt.choices else "1"]
    given = options_from_args(cli.parser().parse_args(argv), lambda path: path)
    assert set(given) == set(OPTIONS)


def test_existing_invocations_keep_their_flags():
    # flags of `airflow-eo ingest` and spark_jobs/kafka_to_delta.py before the spec derived them
    before = ("--table --ingest-id --topics --starting-offsets --max-records-per-run --on-data-loss --transform-sql "
              "--transform --value-schema --max-value-bytes --value-format --key-format --key-schema --avro-schema "
              "--key-avro-schema --value-subject --value-schema-version --key-subject --dead-letter-table "
              "--max-dead-letters --max-dead-letter-fraction --schema-evolution --table-property --partition-by "
              "--close-after --dedup-key --dedup-horizon --duplicates-to-dead-letters --mirror-consumer-group").split()
    assert set(before) <= set(flags_of(ingest_parser()).values())
    job_before = "--table-uri --attempt-id --ingest-id --topics --run-key --starting-offsets --max-records-per-run " \
                 "--on-data-loss --transform-sql --transform".split()
    assert set(job_before) <= set(flags_of(job_parser()).values())


def test_the_merge_flags_are_spelled_as_the_issue_fixed_them():
    actions = {max(a.option_strings, key=len): a for a in ingest_parser()._actions if a.option_strings}
    shown = {flag: f"{flag} {'{' + ','.join(a.choices) + '}' if a.choices else a.metavar}"
             for flag, a in actions.items() if flag in ("--write-mode", "--merge-key", "--delete-when", "--cdc-format")}
    assert shown == {"--write-mode": "--write-mode {append,merge}", "--merge-key": "--merge-key COLUMN[,COLUMN]",
                     "--delete-when": "--delete-when EXPR", "--cdc-format": "--cdc-format {debezium}"}
    args = cli.parser().parse_args(["ingest", "--table", "/t", "--ingest-id", "i", "--topics", "t", "--write-mode", "merge",
                                    "--merge-key", "id,tenant", "--delete-when", "value IS NULL",
                                    "--cdc-format", "debezium"])
    given = options_from_args(args, lambda path: path)
    assert given == {"table_uri": "/t", "ingest_id": "i", "topics": "t", "write_mode": "merge", "merge_key": "id,tenant",
                     "delete_when": "value IS NULL", "cdc_format": "debezium"}


@pytest.fixture(scope="module")
def operator_class():
    from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator

    return KafkaToDeltaOperator


def test_the_operator_takes_each_option_as_a_keyword_and_keeps_it(operator_class):
    values = {o.name: f"value-of-{o.name}" for o in all_options()}
    op = operator_class(task_id="ingest", **values)
    assert {name: getattr(op, name) for name in OPTIONS} == values


def test_the_operator_names_no_option_the_spec_lacks(operator_class):
    code = operator_class.__init__.__wrapped__.__code__  # the parameters as written in the source
    written = set(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
    assert written - {"self"} == OPERATOR_OWN, "an argument written out is neither in OPERATOR_OWN nor " \
        "the spec's (an option is a field of the spec, not a parameter copied into the operator)"
    # what Airflow sees (default_args, partial/expand): its own arguments and every option
    seen = set(inspect.signature(operator_class.__init__).parameters) - {"self", "kwargs"}
    assert seen == OPERATOR_OWN | set(OPTIONS)
    fields = set(operator_class.template_fields)
    assert set(templated_options()) <= fields
    assert fields - set(templated_options()) <= OPERATOR_OWN


def test_options_are_mappable_and_take_default_args(operator_class):
    from airflow.providers.common.compat.sdk import DAG

    with DAG("surfaces", schedule=None):
        mapped = operator_class.partial(task_id="ingest", topics="orders").expand(table_uri=["/a", "/b"])
        op = operator_class(task_id="one", table_uri="/t", topics="t", default_args={"max_records_per_run": 7})
    assert type(mapped).__name__ == "MappedOperator" and op.max_records_per_run == 7
    # no table: the operator's own check (table_uri or sinks), alike on every Airflow version
    with pytest.raises(TypeError, match="table_uri"):
        operator_class(task_id="none", topics="t")


def test_the_operator_documents_each_option(operator_class):
    documented = set(re.findall(r":param (\w+):", operator_class.__doc__))
    assert documented == set(OPTIONS) | (OPERATOR_OWN - {"spark_hook_kwargs", "reprocess_dag_id"})


def test_the_docs_options_table_is_the_rendering_of_the_spec():
    text = OPTIONS_PAGE.read_text()
    start = text.index("<!-- options:")
    section = text[text.index("\n", start) + 1:text.index("<!-- /options -->")]
    assert section == options_table(), "docs/reference/options.md's table is stale: python -m airflow_eo.spec.surfaces renders it"
    assert re.findall(r"^\| `(\w+)` \|", section, re.M) == [o.name for o in all_options()]


def test_the_standalone_job_builds_the_spec_from_its_flags():
    from airflow_eo.loop.config import IngestConfig

    args = job_parser().parse_args(["--table-uri", "/data/orders", "--ingest-id", "orders", "--topics", "a,b",
                                    "--max-offsets-per-task", "500", "--partition-by", "date",
                                    "--transform-sql", "SELECT *, to_date(timestamp) AS date FROM source"])
    config = IngestConfig(**options_from_args(args, lambda path: path), kafka_config={"bootstrap.servers": "b"})
    assert (config.table_uri, config.topics, config.spec.table.partition_by) == ("/data/orders", ("a", "b"), ("date",))
    assert config.spec.spark.max_offsets_per_task == 500 and args.attempt_id is None
