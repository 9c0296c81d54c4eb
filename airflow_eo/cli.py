"""The ``airflow-eo`` command: ``ingest``, ``plan``, ``reprocess``, ``status``, ``maintain``, ``audit``, ``connect-server`` and ``demo``.

``airflow-eo ingest`` runs one batch through the same loop the Airflow operator uses
(plan, log the plan, spark-submit, verify); ``airflow-eo plan`` shows what ``ingest`` with the
same options would read and write next, writing nothing; ``airflow-eo reprocess`` replaces one committed
batch's rows through the operator's reprocess; ``airflow-eo status`` reads a table's ledger
and, when Kafka is reachable, its lag; ``airflow-eo demo`` does the whole thing on the
embedded broker; ``airflow-eo audit`` reconciles a table with Kafka offset by offset (docs/audit.md).

Example::

    $ airflow-eo ingest --table /data/orders --ingest-id orders_raw --topics orders \\
          --bootstrap-servers 127.0.0.1:9092 --master 'local[2]'
    $ airflow-eo plan --table /data/orders --ingest-id orders_raw --topics orders --bootstrap-servers 127.0.0.1:9092
    $ airflow-eo status /data/orders --ingest-id orders_raw --bootstrap-servers 127.0.0.1:9092
    $ airflow-eo reprocess /data/orders --ingest-id orders_raw --topics orders --bootstrap-servers 127.0.0.1:9092 \\
          --transform-sql '…' --range 'orders[0] 0..5000'      # or --run-key KEY (docs/reprocess.md)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import uuid

from airflow_eo.attempt import Env
from airflow_eo.core.errors import AirflowEoError, ConfigError
from airflow_eo.spec import add_arguments

log = logging.getLogger("airflow_eo")


def _kafka_config(args) -> dict:
    config: dict = _json_option(args.kafka_config) or _json_option(os.environ.get(Env.KAFKA_CONFIG)) or {}
    if args.bootstrap_servers:
        config["bootstrap.servers"] = args.bootstrap_servers
    return config


def _storage_options(args) -> dict | None:
    """deltalake storage options: ``--storage-options`` JSON/@file, else $AIRFLOW_EO_STORAGE_OPTIONS."""
    return _json_option(args.storage_options or os.environ.get(Env.STORAGE_OPTIONS))


def _schema_registry(args) -> dict | None:
    """SchemaRegistryClient config: ``--schema-registry URL`` over $AIRFLOW_EO_SCHEMA_REGISTRY_CONFIG
    (JSON, where credentials go: ``basic.auth.user.info``, ``bearer.auth.*``)."""
    from urllib.parse import urlsplit

    config = _json_option(os.environ.get(Env.SCHEMA_REGISTRY)) or {}
    if args.schema_registry:
        if any(urlsplit(u.strip()).password for u in args.schema_registry.split(",")):
            raise ConfigError("--schema-registry has credentials in its URL, which would show in the process "
                              f"list: put them in ${Env.SCHEMA_REGISTRY} as basic.auth.user.info")
        config["url"] = args.schema_registry
    return config or None


def _read_text(path: str) -> str:
    """The text of an option given as ``@file`` (an .avsc schema)."""
    with open(path) as f:
        return f.read()


def _json_option(text: str | None) -> dict | None:
    """An option given as JSON, or as ``@file.json``; None when not given."""
    if not text:
        return None
    if text.startswith("@"):
        with open(text[1:]) as f:
            text = f.read()
    return json.loads(text)


def _pairs(values: list[str] | None, option: str) -> dict[str, str]:
    """``KEY=VALUE`` options (repeatable) as a dict."""
    bad = [v for v in values or [] if "=" not in v]
    if bad:
        raise ConfigError(f"{option} {bad[0]!r} is not KEY=VALUE: write e.g. {option} delta.checkpointInterval=50")
    return dict(v.split("=", 1) for v in values or [])


def _secrets(args):
    """The secrets of a command line: from their own flags or the environment, never from a spec file."""
    from airflow_eo.attempt import Secrets

    return Secrets(_kafka_config(args), _storage_options(args), _schema_registry(args))


def _options(args, interval=None) -> dict:
    """The spec's options a command line gives (raw values): a ``--spec`` file's keys, each
    overridden by its flag where one is given beside it."""
    from airflow_eo.spec import options_from_args

    flags = options_from_args(args, _read_text)  # only the flags typed: every flag defaults to None
    path = getattr(args, "spec", None)
    options = {**(_spec_file(path) if path else {}), **flags}
    if path and options.get("sinks"):
        _note_sink_overrides(path, flags, options["sinks"])
    if interval is not None:
        options.setdefault("mode", "interval")
    return options


def _ingest_of(args, options: dict, submitter):
    """The ingest a command line describes (:class:`airflow_eo.loop.ingest.FanOut`: its one table, or its
    sinks): its spec checked before Spark's client starts."""
    from airflow_eo.loop.ingest import FanOut
    from airflow_eo.spec.fanout import FanOutSpec

    spec = FanOutSpec.of(**options)  # a bad option is refused before Spark's client starts
    return FanOut(spec, _secrets(args), submitter() if callable(submitter) else submitter)


def _submitter(args):
    """spark-submit, or a Spark Connect server (``--remote``); SIGTERM stops its work."""
    from airflow_eo.submit.spark_submit import LocalSparkSubmit

    conf = _pairs(args.conf, "--conf")
    if args.remote:  # the warm path: each batch on a long-lived Spark Connect server
        from airflow_eo.submit.connect import ConnectSubmitter

        submitter = ConnectSubmitter(args.remote, conf=conf)
        submitter.prepare()  # the client's imports and channel while the batch is planned
    else:
        submitter = LocalSparkSubmit(master=args.master, conf=conf)
    _stop_spark_on_sigterm(submitter)
    return submitter


# --spec FILE: the operator's arguments as JSON. The keys a spec file must not hold, each with where
# it goes instead: secrets stay on their flags and environment (a file is copied, committed, shared).
_NOT_IN_SPEC_FILE = {
    "kafka_config": f"it may hold secrets: give it by --kafka-config @file.json or ${Env.KAFKA_CONFIG}",
    "storage_options": f"they may hold credentials: give them by --storage-options @file.json or ${Env.STORAGE_OPTIONS}",
    "schema_registry": f"give the URL by --schema-registry and credentials in ${Env.SCHEMA_REGISTRY}",
    "bootstrap_servers": "give them by --bootstrap-servers (or in the Kafka config)",
    "kafka_conn_id": "a command line has no Airflow connections: give --bootstrap-servers and --kafka-config",
    "storage_conn_id": f"a command line has no Airflow connections: give --storage-options or ${Env.STORAGE_OPTIONS}",
    "schema_registry_conn_id": "a command line has no Airflow connections: give --schema-registry",
    "spark_conn_id": "give --master or --remote",
    "spark_conf": "give --conf KEY=VALUE (repeatable)",
}


def _spec_file(path: str) -> dict:
    """The options of ``--spec FILE``: a JSON object whose keys are the operator's argument names
    (the spec's options, and ``sinks``: a list of objects of the same options, one per table). An
    option read from a file (``avro_schema``) may be ``"@path"``, relative to the spec file."""
    from airflow_eo.spec import OPTIONS, option_of

    try:
        with open(path) as f:
            raw = json.load(f)
    except OSError as exc:
        raise ConfigError(f"--spec {path}: cannot read it ({exc.strerror})") from None
    except ValueError as exc:  # json.JSONDecodeError, or bytes that are no text
        raise ConfigError(f"--spec {path} is not JSON ({exc}): write one object of the operator's arguments, "
                          'e.g. {"topics": ["orders"], "sinks": [{"table_uri": "/data/orders"}]}') from None
    if not isinstance(raw, dict):
        raise ConfigError(f"--spec {path} holds a JSON {type(raw).__name__}: write one object of the operator's "
                          'arguments, e.g. {"topics": ["orders"], "sinks": [{"table_uri": "/data/orders"}]}')
    sinks = raw.get("sinks")
    if "sinks" in raw and (not isinstance(sinks, list) or not all(isinstance(s, dict) for s in sinks)):
        raise ConfigError(f"--spec {path}: sinks must be a list of objects, one per table "
                          '(e.g. [{"table_uri": "/data/orders"}]), not ' + json.dumps(sinks)[:80])
    here = os.path.dirname(os.path.abspath(path))

    def checked(options: dict, where: str) -> dict:
        for key in options:
            if key in _NOT_IN_SPEC_FILE:
                raise ConfigError(f"--spec {path}: {where}{key} does not go in a spec file: {_NOT_IN_SPEC_FILE[key]}")
            if key not in OPTIONS and not (key == "sinks" and not where):
                raise ConfigError(f"--spec {path}: {where}{key} is not an argument of the operator{_did_you_mean(key)}"
                                  ": the keys are the ingest options (docs/reference/options.md) and sinks")
        return {key: _read_text(os.path.join(here, value[1:])) if option_of(key).from_file and isinstance(value, str)
                and value.startswith("@") else value for key, value in options.items() if key != "sinks"}

    options = checked(raw, "")
    if "sinks" in raw:
        options["sinks"] = [checked(sink, f"sink {i + 1}: ") for i, sink in enumerate(sinks or [])]
    return options


def _did_you_mean(key: str) -> str:
    import difflib

    from airflow_eo.spec import OPTIONS

    close = difflib.get_close_matches(key, [*OPTIONS, "sinks"], n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _note_sink_overrides(path: str, flags: dict, sinks: list[dict]) -> None:
    """A flag overrides the spec file's top-level key; a sink that sets the key itself keeps its own
    value (a sink's keys overlay the shared ones): say so, as the flag does not reach that table."""
    from airflow_eo.spec import option_of

    for key in flags:
        kept = [str(s.get("table_uri", i)) for i, s in enumerate(sinks) if key in s]
        if kept and key != "topics":  # a sink's topics pick from the source's: the flag still applies
            log.info("%s overrides %s of %s; the sink(s) of %s set their own %s and keep it", option_of(key).flag,
                     key, path, ", ".join(kept), key)


def _interval(args):
    from airflow_eo.core.intervals import interval_of

    if (args.interval_start is None) != (args.interval_end is None):
        raise ConfigError("give both --interval-start and --interval-end (interval mode), or neither")
    return interval_of(args.interval_start, args.interval_end) if args.interval_start is not None else None


def cmd_ingest(args) -> int:
    """One batch: its one table, or one read into each table of its sinks (:mod:`airflow_eo.loop.ingest`)."""
    from airflow_eo.core.offsets import RunIdentity

    interval = _interval(args)
    run = RunIdentity(args.run_key or f"cli-{uuid.uuid4().hex}")
    result = _ingest_of(args, _options(args, interval), lambda: _submitter(args)).run(run, interval)
    _print(result.to_dict(), args.json)
    return 0


def cmd_plan(args) -> int:
    """What ``ingest`` with the same options would read and write next, writing nothing
    (:mod:`airflow_eo.loop.preview`): each of its tables."""
    from airflow_eo.core.offsets import RunIdentity
    from airflow_eo.loop.preview import NO_SPARK, plan_previews

    interval = _interval(args)
    # no --run-key: a run of its own (ingest's default), so no logged plan is replayed
    run = RunIdentity(args.run_key or "")
    previews = plan_previews(_ingest_of(args, _options(args, interval), NO_SPARK), run, interval,
                             count_records=not args.no_count)
    print(json.dumps(previews.to_dict(), default=str) if args.json else "\n".join(previews.lines()))
    return 0


def cmd_reprocess(args) -> int:
    """Replace one committed batch's rows, in each table of the ingest or in the one named (the operator's
    reprocess, :mod:`airflow_eo.loop.reprocess`)."""
    from airflow_eo.core.offsets import RunIdentity
    from airflow_eo.loop.reprocess import parse_range, reprocess, run_key_of_ranges

    if (args.run_key is None) == (not args.range):
        raise ConfigError("name the batch to reprocess by --run-key KEY or by its --range options, not both")
    if args.table_uri and args.table and args.spec is None:
        raise ConfigError("give the table as TABLE or as --table (with --spec: one of its tables), not both")
    options = _options(args)
    table = args.table if args.spec else None
    if args.table_uri and args.spec:
        table = args.table_uri  # with --spec, TABLE names which of its tables
    elif args.table_uri or args.table:
        options["table_uri"] = args.table_uri or args.table
    ranges = [parse_range(r) for r in args.range or []]
    ingest = _ingest_of(args, options, lambda: _submitter(args))
    target = args.run_key or run_key_of_ranges(ingest, ranges, table)
    requester = RunIdentity(args.request_key or f"cli-reprocess-{uuid.uuid4().hex}")
    result = reprocess(ingest, requester, target_run_key=target, table=table)
    _print(result.to_dict(), args.json)
    return 0


def _stop_spark_on_sigterm(submitter) -> None:
    """SIGTERM (a scheduler stopping the command) stops the batch's Spark work too: the
    spark-submit child, or the attempt's operations on the Spark Connect server."""
    import signal

    def stop(signum, _frame):
        submitter.kill()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def cmd_maintain(args) -> int:
    from airflow_eo.table.maintenance import DEFAULT_RETAIN_HOURS, MaintenancePlan, maintain

    chosen = {"compact": args.compact, "vacuum": args.vacuum, "checkpoint": args.checkpoint,
              "cleanup_log": args.cleanup_log, "prune_orphans": args.prune, "prune_records": args.prune}
    if not any(chosen.values()):  # none named: the default set
        chosen = dict.fromkeys(chosen, True)
    if args.keep_days is not None:
        chosen["keep_days"] = args.keep_days
    if args.table_wait_timeout is not None:
        from airflow_eo.spec.options import duration

        chosen["table_wait_timeout"] = duration(args.table_wait_timeout)
    if args.retain_hours is not None and args.retain_hours < 0:
        raise ConfigError(f"--retain-hours {args.retain_hours} is negative: give hours >= 0")
    plan = MaintenancePlan(z_order=tuple(c.strip() for c in (args.z_order or "").split(",") if c.strip()),
                           target_file_bytes=args.target_file_bytes,
                           retain_hours=DEFAULT_RETAIN_HOURS if args.retain_hours is None else args.retain_hours,
                           **chosen)
    run_key = f"cli-maintain-{uuid.uuid4().hex}"  # the lease holder status shows while it runs
    done = {"table": maintain(args.table, _storage_options(args), plan, run_key)}
    if args.dead_letter_table:
        done["dead_letter_table"] = maintain(args.dead_letter_table, _storage_options(args), plan, run_key)
    _print(done, False)
    return 0


def cmd_status(args) -> int:
    from airflow_eo.sinks import recorded_sink
    from airflow_eo.status import table_status

    from airflow_eo.spec import parse_option

    status = table_status(args.table, args.ingest_id, _kafka_config(args), storage_options=_storage_options(args),
                          topics=tuple(parse_option("topics", args.topics) if args.topics else ()),
                          starting_offsets=parse_option("starting_offsets", args.starting_offsets),
                          adopt_table=args.adopt_table)
    if args.json:
        print(json.dumps(status.to_dict(), indent=2))
        return 0
    note = recorded_sink(status.write_mode).table_note
    print(f"table {status.table_uri}  version {status.version}  last batch {status.last_batch}"
          f"{f'  ({note})' if note else ''}")
    print(f"{'topic':<24}{'partition':>10}{'committed':>12}{'end':>12}{'lag':>10}")
    for p in status.partitions:
        print(f"{p.topic:<24}{p.partition:>10}{_n(p.committed):>12}{_n(p.end):>12}{_n(p.lag):>10}")
    lay = status.layout
    print(f"files {lay.files}  average {lay.average_file_bytes:,} bytes  commits since checkpoint "
          f"{lay.versions_since_checkpoint}  maintenance due: {'; '.join(status.due) or 'none'}")
    if status.intervals:
        gaps = status.interval_gaps
        print(f"intervals: {len(status.intervals)} committed, {len(gaps)} gap(s)")
        for c in status.intervals[-10:]:
            print(f"  batch {c.batch:>5}  {c.interval}")
        for g in gaps[:10]:
            print(f"  gap          {g}")
    print(f"lease: held by {status.lease.describe()}" if status.lease else "lease: free")
    for a in status.attempts:
        print(f"waiting for: attempt {a.attempt_id} ({a.kind}, batch {a.batch}, run {a.run_key}) on "
              f"{a.host} pid {a.pid}, {a.age_seconds:.0f} s old: {a.why}")
    audit = status.last_audit
    print(f"last audit: {audit.audited_at} through version {audit.through_version}: {audit.summary}"
          if audit else "last audit: none (airflow-eo audit)")
    print("last batches:")
    for b in status.batches:
        late = f"  late {b.late}" if b.late else ""
        counts = f"  {b.counts_text}" if b.counts_text else ""
        print(f"  batch {b.batch:>5}  version {b.version:>5}  rows {b.rows:>9}  {b.operation}  "
              f"{', '.join(b.ranges)}{late}{counts}")
    return 0


def cmd_audit(args) -> int:
    """Exit 0 clean, 1 drift; errors (no table, no broker) exit 2 through :func:`main`."""
    from airflow_eo.audit.run import AuditRequest, Selection, run_audit
    from airflow_eo.submit.audit import SparkSlices

    if args.all:
        selection, value = Selection.ALL, None
    elif args.batches is not None:
        selection, value = Selection.BATCHES, args.batches
    elif args.since_version is not None:
        selection, value = Selection.SINCE_VERSION, args.since_version
    else:
        selection, value = Selection.SINCE_LAST_AUDIT, None
    if args.spark_threshold is not None and args.spark_threshold < 0:
        raise ConfigError(f"--spark-threshold {args.spark_threshold} is negative: give a number of offsets >= 0")
    spark = None  # Spark starts only for an audit large enough (SparkSlices opens its session on first use)
    if not args.in_process:
        conf = _pairs(args.conf, "--conf")
        spark = SparkSlices(remote=args.remote, conf=conf) if args.remote else SparkSlices(master=args.master, conf=conf)
        _stop_spark_on_sigterm(spark)
    try:
        report = run_audit(AuditRequest(args.table, args.ingest_id, _kafka_config(args), _storage_options(args),
                                        selection, value, args.dead_letter_table,
                                        spark_threshold=args.spark_threshold), spark=spark)
    finally:
        if spark is not None:
            spark.close()
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        print("\n".join(report.lines()))
    return report.exit_code


def _audit_parser(sub) -> None:
    from airflow_eo.audit import SPARK_THRESHOLD_COLD, SPARK_THRESHOLD_WARM

    au = sub.add_parser("audit", help="reconcile a table with Kafka: every committed offset in the table once "
                        "(exit 0 clean, 1 drift, 2 error)",
                        epilog="exit status: 0 clean, 1 drift found, 2 error (no table, unreachable broker); "
                        "what each finding means: docs/audit.md")
    au.add_argument("table")
    au.add_argument("--ingest-id", required=True)
    _kafka_args(au)
    _storage_args(au)
    which = au.add_mutually_exclusive_group()
    which.add_argument("--batches", type=int, metavar="N", help="audit the newest N batches")
    which.add_argument("--since-version", type=int, metavar="V", help="audit the batches committed at table version V or later")
    which.add_argument("--all", action="store_true", help="audit every batch the Delta log holds "
                       "(default: the batches since the last recorded audit, or all when there is none)")
    which.add_argument("--since-last-audit", action="store_true", help="audit the batches committed since the "
                       "last recorded audit, or all when there is none (the default, so a daily audit reads only "
                       "new batches)")
    au.add_argument("--dead-letter-table", metavar="URI", help="the ingest's dead-letter table: offsets found there "
                    "are accounted for")
    au.add_argument("--json", action="store_true", help="the report as JSON")
    spark = au.add_argument_group("where the comparison runs: audits checking fewer than --spark-threshold offsets "
                                  "run in this process, larger ones as Spark tasks (one per slice of up to "
                                  "1,000,000 offsets of a partition)")
    spark.add_argument("--spark-threshold", type=int, metavar="OFFSETS",
                       help=f"offsets checked from which Spark is used (0: always; default {SPARK_THRESHOLD_WARM:,} "
                       f"on a Spark Connect server, {SPARK_THRESHOLD_COLD:,} with --master, which starts a JVM "
                       "first)")
    spark.add_argument("--master", default="local[*]", help="Spark master of a session in this process (client "
                       "mode: local[*], spark://host:7077, yarn)")
    spark.add_argument("--remote", help="run the Spark tasks on this Spark Connect server (sc://host:port) instead")
    spark.add_argument("--conf", action="append", help="extra Spark conf key=value (repeatable)")
    spark.add_argument("--in-process", action="store_true", help="never start Spark: compare every slice here")
    au.set_defaults(func=cmd_audit)


def cmd_connect_server(args) -> int:
    from airflow_eo.submit.connect_server import serve

    return serve(args.port, args.master, _pairs(args.conf, "--conf"), args.log_level, token_file=args.token_file,
                 ready_file=args.ready_file)


def cmd_demo(args) -> int:
    try:
        from airflow_eo.demo import run_demo  # a development extra: loaded only for this command
    except ImportError as exc:
        print(f"airflow-eo demo needs the demo extra ({exc}): pip install 'airflow-eo[demo]'", file=sys.stderr)
        return 2

    return run_demo(args.dir, records=args.records)


def _n(value) -> str:
    return "-" if value is None else str(value)


def _print(payload: dict, as_json: bool) -> None:
    print(json.dumps(payload, indent=None if as_json else 2, default=str))


def _kafka_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap-servers", help="Kafka bootstrap servers (host:port,...)")
    p.add_argument("--kafka-config", help="client config as JSON, or @file.json (default: $AIRFLOW_EO_KAFKA_CONFIG)")


def _storage_args(p) -> None:
    p.add_argument("--storage-options", help="deltalake storage options as JSON or @file.json "
                   "(default: $AIRFLOW_EO_STORAGE_OPTIONS; keep credentials out of the command line)")


def _spark_args(p) -> None:
    p.add_argument("--master", default="local[*]", help="Spark master for spark-submit")
    p.add_argument("--remote", help="run the batch on this Spark Connect server (sc://host:port) instead of "
                   "starting spark-submit; see `airflow-eo connect-server`")
    p.add_argument("--conf", action="append", help="extra Spark conf key=value (repeatable)")


def _registry_args(p) -> None:
    p.add_argument("--schema-registry", metavar="URL",
                   help=f"Confluent Schema Registry URL (credentials only in ${Env.SCHEMA_REGISTRY})")


def _add_reprocess(sub) -> None:
    rep = sub.add_parser(
        "reprocess", help="re-read one committed batch's offset ranges with the given transform and replace "
        "its rows in one commit (offsets and other batches untouched)",
        description="Reprocess one committed batch, named by the run key that committed it or by its offset "
        "ranges; the same code path, guarantees and refusals as the operator's reprocess (docs/reprocess.md).")
    rep.add_argument("table_uri", metavar="TABLE", nargs="?", help="the Delta table: a local path or an s3://… URI "
                     "(with --spec: which of its tables; default every one)")
    rep.add_argument("--spec", metavar="FILE", help="the ingest's options as `ingest --spec` takes them: the batch "
                     "is read once and replaced in each of its tables (or in --table)")
    rep.add_argument("--table", metavar="URI", help="with --spec: reprocess only this table of it")
    add_arguments(rep, skip=("table_uri",), require=False)  # the spec's options: what to reprocess with
    which = rep.add_argument_group("the batch to reprocess (one of)")
    which.add_argument("--run-key", help="the run key that committed the batch (an Airflow task's "
                       "<dag_id>/<run_id>/<task_id>/<map_index>, or the --run-key given to `ingest`)")
    which.add_argument("--range", action="append", metavar="'TOPIC[P] START..END'",
                       help="an offset range of the batch as `airflow-eo status` lists it (repeatable): all of "
                       "the batch's ranges, exactly")
    rep.add_argument("--request-key", help="stable key of this request: the same command again after a crash or a "
                     "kill replays it and never replaces the rows twice; once it has finished, the same command "
                     "reprocesses again (default: a new key)")
    _kafka_args(rep)
    _spark_args(rep)
    _storage_args(rep)
    _registry_args(rep)
    rep.add_argument("--json", action="store_true")
    rep.set_defaults(func=cmd_reprocess)


def _ingest_arguments(p) -> None:
    """What ``ingest`` and ``plan`` both take: the spec's options (or a spec file of them), Kafka, Spark,
    storage, registry, interval."""
    p.add_argument("--spec", metavar="FILE", help="the ingest's options as a JSON object keyed by the operator's "
                   "argument names, with `sinks`: a list of objects, one per table (one read into each); a flag "
                   "given beside it overrides its key. Secrets never go in it: Kafka config, storage options and "
                   "registry credentials stay on their flags and environment")
    # every option of the spec (airflow_eo.spec), with its help and default; the required ones are
    # checked once flags and spec file are merged (the file may hold them)
    add_arguments(p, require=False)
    _kafka_args(p)
    _spark_args(p)
    _storage_args(p)
    _registry_args(p)
    p.add_argument("--interval-start", metavar="T0", help="interval mode: ingest the records of [T0, T1) by Kafka "
                   "timestamp (ISO-8601 with a zone, or epoch ms); with --interval-end")
    p.add_argument("--interval-end", metavar="T1", help="interval mode: the end of the data interval (exclusive)")
    p.add_argument("--json", action="store_true")


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="airflow-eo", description="Exactly-once Kafka → Delta ingestion on Spark")
    sub = root.add_subparsers(dest="command", required=True)
    ing = sub.add_parser("ingest", help="plan, run and verify one batch (the operator's code path)")
    _ingest_arguments(ing)
    ing.add_argument("--run-key", help="stable key: re-running with the same key replays, never duplicates")
    ing.set_defaults(func=cmd_ingest)
    pl = sub.add_parser("plan", help="preview what `ingest` with the same options would read and write next: "
                        "batch, ranges, records, interval, reader schemas, tables; writes nothing, starts no Spark",
                        description="Preview the next batch of an ingest: the options are `ingest`'s (Spark's are "
                        "accepted and unused), the answer is what `ingest` would do now, decided by the same planner. "
                        "It reads the table and Kafka only: no plan is logged, nothing is staged or collected, no "
                        "Spark job starts.")
    _ingest_arguments(pl)
    pl.add_argument("--run-key", help="preview the next run of this key: its logged plan where it has one "
                    "(a retry replays it), else a new plan (default: a new run)")
    pl.add_argument("--no-count", action="store_true", help="do not count the records in the planned ranges "
                    "(the count reads their record-batch headers from Kafka; without it only offsets are shown)")
    pl.set_defaults(func=cmd_plan)
    _add_reprocess(sub)
    st = sub.add_parser("status", help="committed offsets, end offsets, lag and last batches of a table")
    st.add_argument("table")
    st.add_argument("--ingest-id", required=True)
    st.add_argument("--topics", help="the ingest's topics (comma-separated): their partitions the table has no "
                    "offsets for yet are listed too, with the lag from --starting-offsets (default: the last "
                    "batch's topics)")
    st.add_argument("--starting-offsets", help="the ingest's starting_offsets: where partitions without offsets "
                    "count from (default: earliest)")
    st.add_argument("--adopt-table", action="store_true", help="the ingest adopts the table (its adopt_table): "
                    "a table created elsewhere that it has not written yet shows no offsets, instead of being "
                    "refused as another ingest's")
    _kafka_args(st)
    _storage_args(st)
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)
    mt = sub.add_parser("maintain", help="compact, vacuum, checkpoint, clean the log and prune a table, keeping "
                        "its offsets and reprocess; no action named: all of them")
    mt.add_argument("table")
    mt.add_argument("--compact", action="store_true", help="bin-pack small files (deltalake optimize.compact)")
    mt.add_argument("--z-order", metavar="COLS", help="compact with Z-order on these comma-separated columns")
    mt.add_argument("--target-file-bytes", type=int, help="target size of compacted files (default 100 MB)")
    mt.add_argument("--vacuum", action="store_true", help="delete files that commits removed, after --retain-hours")
    mt.add_argument("--retain-hours", type=int, help="keep removed files this long (default 168, Delta's)")
    mt.add_argument("--checkpoint", action="store_true", help="write a checkpoint of the log")
    mt.add_argument("--cleanup-log", action="store_true", help="delete expired log files a checkpoint covers")
    mt.add_argument("--prune", action="store_true", help="delete staged files of dead attempts, and plan logs and "
                    "attempt records older than --keep-days that nothing needs")
    mt.add_argument("--keep-days", type=float, help="age of plan logs and attempt records --prune deletes (default 30)")
    mt.add_argument("--dead-letter-table", help="maintain this dead-letter table the same way")
    mt.add_argument("--table-wait-timeout", metavar="DURATION", help="how long to wait for the table's lease while a "
                    "run of the table holds it (default 15m; then it maintains anyway: every action is safe beside a run)")
    _storage_args(mt)
    mt.set_defaults(func=cmd_maintain)
    _audit_parser(sub)
    srv = sub.add_parser("connect-server", help="run a local Spark Connect server (127.0.0.1) for --remote / "
                         "spark_connect connections; prints its sc:// URL once it is ready (warm), stops on SIGTERM")
    srv.add_argument("--port", type=int, default=15002)
    srv.add_argument("--master", default="local[*]", help="Spark master of the server (local[*], spark://…)")
    srv.add_argument("--token-file", metavar="PATH", help="clients must send the token in PATH (a new random one is "
                     "written there, mode 0600, if it does not exist; default: a file in the server's scratch "
                     "directory, printed at start); clients: $SPARK_CONNECT_AUTHENTICATE_TOKEN")
    srv.add_argument("--conf", action="append", help="extra Spark conf key=value (repeatable)")
    srv.add_argument("--ready-file", metavar="PATH", help="create PATH once the server is ready (warmed up: a "
                     "batch runs at full speed), remove it when the server stops: for a health check")
    srv.add_argument("--log-level", default="WARN", help="Spark's own log level (default WARN)")
    srv.set_defaults(func=cmd_connect_server)
    demo = sub.add_parser("demo", help="embedded broker + sample data + ingestion through Airflow + show the table")
    demo.add_argument("--dir", default="demo-data", help="where the demo table and Airflow home go")
    demo.add_argument("--records", type=int, default=10_000)
    demo.set_defaults(func=cmd_demo)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        code = args.func(args)
    except AirflowEoError as exc:
        print(f"airflow-eo: {exc.__class__.__name__}: {exc}", file=sys.stderr)
        code = 2
    if argv is None and args.command in _QUICK_EXIT:  # this process is the command (not a caller's import)
        _exit_now(code)
    return code


# Commands whose process ends right after them: tearing the interpreter down (pyarrow's and
# librdkafka's threads, the gRPC channel, thousands of module objects) took 0.6-1.0 s after a warm
# batch had printed its result, a third of a small batch. Everything that must happen has happened
# by then: the commit is verified, the result printed, the Connect client is closed below.
_QUICK_EXIT = ("ingest", "reprocess")


def _exit_now(code: int) -> None:
    connect = sys.modules.get("airflow_eo.submit.connect")
    if connect is not None:
        connect.close_clients()  # its pending release calls go out first
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
