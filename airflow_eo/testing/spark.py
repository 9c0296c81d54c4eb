"""Spark's JVM start, trimmed for a test session: the C1 compiler, the serial collector and a class archive.

A test session starts dozens of JVMs (each ``spark-submit``, the local session, Spark Connect servers),
each of which spends its first seconds loading and compiling the same classes. Two things cut that:

* the JIT and collector options the batch jobs already run with (``BATCH_JVM_OPTIONS`` of
  :mod:`airflow_eo.submit.spark_submit`), for every JVM the session starts;
* a class-data-sharing archive (JDK AppCDS) of the classes a small Spark job loads, built once per
  environment into ``<sys.prefix>/spark-jvm-cache/`` (about 160 MB, 20 s of one core) and mapped by
  every later JVM.

Measured on a busy 2-core machine: ``spark-submit`` of a job that writes 100 rows to Parquet took
20-23 s of CPU with the defaults, 9-11 s with the two options, 5.5 s with the archive too.

``AIRFLOW_EO_TEST_JVM=options`` keeps the two options without the archive (CI's short per-version
lanes, each in a fresh environment: a dozen JVMs save less than the build costs),
``AIRFLOW_EO_TEST_JVM=default`` leaves Spark's own settings.

Both reach the JVMs through ``SPARK_SUBMIT_OPTS`` (read by ``spark-submit`` for its JVM: the driver, in
local and client mode also the executor), set in this process's environment before any JVM starts,
so every child inherits it; an option already in ``SPARK_SUBMIT_OPTS`` wins. The archive option names
the file before it exists: a JVM started while it is being built runs without it (the JDK's own
archive only), silently (``-Xlog:cds=off``); the build writes a temporary file and renames it, so
a JVM sees the whole archive or none. The archive's name holds a digest of the Java version and of
Spark's jars, so a new pyspark or JDK builds a new one rather than using a stale one.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from airflow_eo.submit.connect_server import die_with_parent
from airflow_eo.submit.spark_submit import BATCH_JVM_OPTIONS, batch_jvm_options

OPTIONS_ENV = "SPARK_SUBMIT_OPTS"
# archive (the default): the options and the archive; options: the options only (a run of a few JVMs in a
# fresh environment, which would spend more on the build than it saves); default: Spark's own settings
MODE_ENV = "AIRFLOW_EO_TEST_JVM"
QUIET = "-Xlog:cds=off,cds+dynamic=off"  # a missing or foreign archive: no warning on the JVM's stdout
# the build's job: the classes a batch loads (a session, a DataFrame from Python rows, Parquet written
# and read back, an Arrow map over Python workers)
_JOB = """\
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "1").getOrCreate())
df = spark.createDataFrame([(i, str(i)) for i in range(100)], "a long, b string")
df.write.mode("overwrite").parquet(OUT)
back = spark.read.parquet(OUT)
assert back.mapInArrow(lambda batches: batches, back.schema).count() == 100
spark.range(10).groupBy().count().collect()
spark.stop()
"""


def _spark_home() -> Path | None:
    from importlib.util import find_spec

    spec = find_spec("pyspark")
    return Path(spec.origin).parent if spec is not None and spec.origin else None


class ClassArchive:
    """The class-data-sharing archive of this environment's Spark and JVM (see the module's docstring)."""

    def __init__(self, directory: Path | None = None):
        self.directory = Path(directory or os.path.join(sys.prefix, "spark-jvm-cache"))
        self.path: Path | None = None
        self.state = "not started"  # then: "built in N s", "there", "being built elsewhere", "unavailable: why"
        self._build: subprocess.Popen | None = None
        self._started = 0.0

    def _name(self) -> str | None:
        home, java = _spark_home(), shutil.which("java")
        if home is None or java is None or not (home / "jars").is_dir():
            return None
        version = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr
        jars = sorted((p.name, p.stat().st_size) for p in (home / "jars").iterdir())
        digest = hashlib.sha256(repr((version, str(home), jars)).encode()).hexdigest()[:16]
        return f"spark-{digest}.jsa"

    def options(self) -> str:
        """``SPARK_SUBMIT_OPTS`` for the session: the value already set, then what it does not choose."""
        given = os.environ.get(OPTIONS_ENV, "")
        extra = batch_jvm_options(given)
        if self.path is not None and "SharedArchiveFile" not in given and "Xshare" not in given:
            extra += [f"-XX:SharedArchiveFile={self.path}", QUIET]
        return " ".join(filter(None, [given, *extra]))

    def apply(self) -> None:
        """Set ``SPARK_SUBMIT_OPTS`` here (children inherit it), and build the archive in the background
        if it is not there yet and no other process of the session builds it. Call it before the
        session starts a JVM, from the main thread (it changes ``os.environ``)."""
        choice = os.environ.get(MODE_ENV, "archive")
        if choice == "default":
            self.state = f"off ({MODE_ENV}=default)"
            return
        name = self._name() if choice != "options" else None
        if name is None:
            self.state = f"not used ({MODE_ENV}=options)" if choice == "options" else \
                "unavailable: no pyspark jars or no java"
            os.environ[OPTIONS_ENV] = self.options()
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / name
        os.environ[OPTIONS_ENV] = self.options()
        if self.path.exists():
            self.state = "there"
            return
        lock = open(self.directory / f"{name}.lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another process of this session (a pytest-xdist worker) builds it
            lock.close()
            self.state = "being built elsewhere"
            return
        self._start_build(lock)

    def _start_build(self, lock) -> None:
        assert self.path is not None
        scratch = self.directory / f"build-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        (scratch / "job.py").write_text(f"OUT = {str(scratch / 'out')!r}\n" + _JOB)
        partial = scratch / "archive.jsa"
        home = _spark_home()
        env = {**os.environ, OPTIONS_ENV: " ".join([*BATCH_JVM_OPTIONS, f"-XX:ArchiveClassesAtExit={partial}",
                                                    f"-Djava.io.tmpdir={scratch}"]),
               "SPARK_LOCAL_DIRS": str(scratch), "SPARK_LOCAL_IP": "127.0.0.1",
               "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
        submit = str(home / "bin" / "spark-submit") if home else "spark-submit"
        self._started = time.monotonic()
        with open(scratch / "build.log", "w") as log:
            # the build ends with the session's process, however that ends (stop() covers a normal end)
            self._build = subprocess.Popen([submit, "--master", "local[1]", str(scratch / "job.py")], env=env,
                                           stdout=log, stderr=subprocess.STDOUT, cwd=scratch,
                                           preexec_fn=die_with_parent(os.getpid()))
        self.state = "being built"

        def finish():
            try:
                code = self._build.wait(600)
                if code == 0 and partial.exists():
                    os.replace(partial, self.path)
                    self.state = f"built in {time.monotonic() - self._started:.0f} s"
                    shutil.rmtree(scratch, ignore_errors=True)
                else:
                    self.state = f"unavailable: its build exited {code} (log: {scratch / 'build.log'})"
            except subprocess.TimeoutExpired:
                self._build.kill()
                self.state = "unavailable: its build took over 600 s"
            finally:
                lock.close()

        threading.Thread(target=finish, name="spark-class-archive", daemon=True).start()

    def stop(self) -> None:
        """End a build still running (the session ends before it did)."""
        if self._build is not None and self._build.poll() is None:
            self._build.kill()
            self._build.wait()
