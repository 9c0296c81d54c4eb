"""The fault soak: kill batches at least ``--kills`` times while data flows, on every way a batch runs, then count.

Run::

    ./dev soak --kills 100 --restart-every 4 --seed 7      # = python -m tests.system.faults.soak ...

Four ways a batch runs, each into a table of its own (tests/system/faults/paths.py): the driver's
own read of small batches (spark-submit without a SparkContext), Spark tasks through spark-submit,
the warm Spark Connect path (``airflow-eo ingest --remote`` clients of a server started here), and a
merge table (upserts and tombstones, through spark-submit). Trials take the paths in turn; each
trial retries one run key, killing its attempt once in every window — at each step of the protocol
(failpoints before the read, after staging, before and during the compare-and-set commit, after
it), with ``kill -9`` while it reads and at a random moment, and on the Connect path also before it
submits and by killing the server mid-read — and then once more unharmed. Every few trials the
broker is restarted while a run is in flight. After every run each table is checked: the append
tables against the broker (kafka-python, read_committed: every committed record below the
committed offsets exactly once, nothing aborted, nothing beyond), the merge table against the
model of the broker's change records. At the end the producers stop, one run per path drains its
topic, and the table docs/reliability.md shows is printed, with the commit and the command. Exit
code 1 if anything was lost, doubled, or an aborted record reached a table.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from airflow_eo.demo.broker import EmbeddedBroker  # noqa: E402
from airflow_eo.loop.config import IngestConfig  # noqa: E402
from airflow_eo.spec.parts import Transform  # noqa: E402
from tests.changes import SQL as MERGE_SQL  # noqa: E402
from tests.helpers import new_topic  # noqa: E402
from tests.system.faults.harness import (  # noqa: E402
    FlowingProducer, check_table, ingest_config, kill_chain,
)
from tests.system.faults.paths import (  # noqa: E402
    CONNECT_WINDOWS, PROJECTION, ChangeFlow, ConnectClients, Path, check_model, spark_submit_path,
)

PARTITIONS = 3
PATHS = ("driver", "spark", "connect", "merge")


def restart_broker_during_run(broker: EmbeddedBroker, path: Path, run_key: str, delay: float) -> None:
    """One unharmed run with the broker restarted ``delay`` seconds into it. The restart is this
    (main) thread's: the broker dies with the thread that started it (PR_SET_PDEATHSIG), so a
    timer thread's broker would be gone the moment the timer's thread ends."""
    run = threading.Thread(target=path.run, args=(run_key, None, random.Random()), name="run-during-restart")
    run.start()
    time.sleep(delay)
    broker.restart()
    run.join()


def commit_of_this_checkout() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
        return head + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def build_paths(names: tuple[str, ...], broker: EmbeddedBroker, tmp: str, topic: str, change_topic: str,
                producer: FlowingProducer, connect: ConnectClients | None) -> list[Path]:
    bootstrap = broker.bootstrap_servers

    def append_check(table: str, ingest: str):
        return lambda: check_table(table, ingest, topic, PARTITIONS, bootstrap, producer.aborted)

    paths = []
    for name in names:
        table = os.path.join(tmp, name)
        if name == "driver":  # a projection: the driver reads the (small) batch itself, no SparkContext
            config = IngestConfig(table_uri=table, ingest_id=name, topics=[topic], kafka_config=broker.config,
                                  transform=Transform(sql=PROJECTION))
            # its whole job takes ~1.5-2.5 s (no JVM for Spark): a later random kill would come after the commit
            paths.append(spark_submit_path(name, config, append_check(table, name), max_delay=1.5))
        elif name == "spark":  # a transform Spark runs: the tasks read
            paths.append(spark_submit_path(name, ingest_config(table, name, topic, bootstrap), append_check(table, name)))
        elif name == "connect":
            connect.table_uri, connect.ingest_id = table, name
            paths.append(Path(name, connect, CONNECT_WINDOWS, append_check(table, name)))
        elif name == "merge":
            config = IngestConfig(table_uri=table, ingest_id=name, topics=[change_topic], kafka_config=broker.config,
                                  write_mode="merge", merge_key="id", transform_sql=MERGE_SQL)
            path = spark_submit_path(name, config, lambda t=table: check_model(t, "merge", bootstrap, change_topic))
            paths.append(path)
    return paths


def soak(kills: int, seed: int, restart_every: int, out=sys.stdout, paths: tuple[str, ...] = PATHS) -> int:
    rng = random.Random(seed)
    restarts = 0
    started = time.monotonic()
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="airflow-eo-soak-") as tmp:
        topic, change_topic = new_topic(broker.config, PARTITIONS), new_topic(broker.config, PARTITIONS)
        connect = ConnectClients("", "", topic, broker.config, tmp) if "connect" in paths else None
        try:
            if connect is not None:
                connect.start_server()
            with FlowingProducer(broker.config, topic, PARTITIONS) as producer, \
                    ChangeFlow(broker.config, change_topic) as changes:
                lanes = build_paths(paths, broker, tmp, topic, change_topic, producer, connect)
                deadline = time.monotonic() + 120
                while producer.sent < 500 or changes.changes.n < 50:  # every first batch has records to read
                    if time.monotonic() > deadline:
                        raise RuntimeError("the producers wrote nothing in 2 minutes: is the broker up?")
                    time.sleep(0.5)
                trial, idle = 0, {}
                while sum(p.tally.total_kills for p in lanes) < kills or any(p.tally.trials == 0 for p in lanes):
                    if not producer.alive or not changes.alive:
                        raise RuntimeError("a producer thread died: no new data, no kills; see the log")
                    path = lanes[trial % len(lanes)]
                    trial += 1
                    before = path.tally.total_kills
                    kill_chain(path.run, f"soak-{path.name}-{path.tally.trials + 1}", path.chain_windows(rng), rng,
                               path.tally, path.check, until_committed=True)
                    idle[path.name] = 0 if path.tally.total_kills > before else idle.get(path.name, 0) + 1
                    if idle[path.name] >= 3:  # a kill can miss (the batch was done first), three trials cannot
                        raise RuntimeError(f"three {path.name} trials without a kill: is data still flowing?")
                    if restart_every and trial % restart_every == 0:
                        restart_broker_during_run(broker, path, f"soak-{path.name}-restart-{restarts}",
                                                  rng.uniform(3, 20))
                        restarts += 1
                        check = path.check()
                        if not check.ok:
                            path.tally.failures.append(("broker-restart", None, check.summary()))
                    print(f"[{time.monotonic() - started:6.0f}s] trial {trial} ({path.name}): "
                          + ", ".join(f"{p.name} {dict(p.tally.kills)}" for p in lanes), file=out, flush=True)
                producer.stop()
                changes.stop()
                drained = {}
                for path in lanes:  # one unharmed run per path takes what is left
                    drained[path.name] = path.run(f"soak-{path.name}-drain", None, rng)
                    path.final = path.check()
        finally:
            if connect is not None:
                connect.stop()
        seconds = time.monotonic() - started
        print_table(out, lanes, restarts, connect.server_kills if connect else 0, seconds, seed, kills, restart_every)
        failed = False
        for path in lanes:
            final = path.final
            complete = final.expected == final.visible if hasattr(final, "expected") else True
            if not final.ok or path.tally.failures or not complete or drained[path.name].error is not None:
                failed = True
                print(f"\n{path.name}: drain error {drained[path.name].error}; final {final.summary()}; "
                      f"failures {path.tally.failures}", file=out)
    return 1 if failed else 0


def print_table(out, lanes: list[Path], restarts: int, server_kills: int, seconds: float, seed: int, kills: int,
                restart_every: int) -> None:
    """The table docs/reliability.md shows: one column per way a batch runs."""
    windows: list[str] = []
    for p in lanes:
        windows += [w for w in p.windows if w not in windows]

    def cell(path: Path, window: str) -> str:
        return str(path.tally.kills[window]) if window in path.windows else "—"

    def final(path: Path, append: str, merge: str) -> str:
        return str(getattr(path.final, append if hasattr(path.final, "expected") else merge))

    rows = [("trials (run keys)", [str(p.tally.trials) for p in lanes]), ("runs", [str(p.tally.runs) for p in lanes])]
    rows += [(f"kills: {w}", [cell(p, w) for p in lanes]) for w in windows]
    rows += [("kills: total", [str(p.tally.total_kills) for p in lanes])]
    rows += [("records in Kafka (committed)", [final(p, "visible", "visible") for p in lanes]),
             ("records (append) / keys (merge) in the table", [final(p, "in_table", "keys") for p in lanes]),
             ("not ingested after the drain run",
              [str(p.final.visible - p.final.expected) if hasattr(p.final, "expected") else "—" for p in lanes]),
             ("**lost**", [f"**{len(p.final.lost)}**" if hasattr(p.final, "lost") else "—" for p in lanes]),
             ("**duplicated**", [f"**{sum(n - 1 for n in p.final.duplicated.values())}**"
                                 if hasattr(p.final, "duplicated") else "—" for p in lanes]),
             ("aborted records in the table", [str(len(p.final.aborted_in_table)) if hasattr(p.final, "aborted_in_table")
                                               else "—" for p in lanes]),
             ("**table = model of the broker's changes**", ["—" if hasattr(p.final, "expected")
                                                           else ("**yes**" if p.final.ok else "**no**") for p in lanes]),
             ("failed checks after a run", [str(len(p.tally.failures)) for p in lanes])]
    header = ["metric", *[p.name for p in lanes]]
    widths = [max(len(r[0]) for r in rows + [("metric", [])])] + [max(len(p.name), 5) for p in lanes]
    print(f"\ncommit {commit_of_this_checkout()}; ./dev soak --kills {kills} --restart-every {restart_every} "
          f"--seed {seed}; broker restarts {restarts}, Connect server kills {server_kills}, wall time "
          f"{seconds:.0f} s, {os.cpu_count()} cores\n", file=out)
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |", file=out)
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|", file=out)
    for name, values in rows:
        print("| " + " | ".join(v.ljust(w) for v, w in zip([name, *values], widths)) + " |", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev soak", description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=100, help="stop after at least this many kills, over all paths "
                        "(every path gets one trial at least)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--restart-every", type=int, default=4, help="restart the broker every N trials (0: never)")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"the ways a batch runs to soak (default: {','.join(PATHS)})")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    paths = tuple(p for p in args.paths.split(",") if p)
    if not set(paths) <= set(PATHS):
        parser.error(f"--paths: one or more of {', '.join(PATHS)}")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    logging.getLogger("tests.system.faults.harness").setLevel(logging.INFO)
    return soak(args.kills, args.seed, args.restart_every, paths=paths)


if __name__ == "__main__":
    sys.exit(main())
