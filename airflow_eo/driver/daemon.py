"""pyspark's Python worker daemon, with the task start cheaper (``spark.python.daemon.module``).

Spark forks every Python worker from one daemon per executor and sends each task to a worker.
Two fixed costs per task and per worker were measured on the read tasks (py-spy, docs/performance.md):

* every task, pyspark calls ``importlib.invalidate_caches()``, which makes each zip importer
  on ``sys.path`` read its archive's directory again: ``pyspark.zip``, the py4j zip and
  ``spark-core.jar`` (5,000+ entries), once per package imported from them — 0.09–0.25 s a task.
  Those archives were on ``sys.path`` when the daemon started (Spark's installation, Python's
  own) and do not change while it runs, so they keep their directories; every other cache (a
  file or archive a session adds) is still invalidated.
* every new worker imports pyarrow, confluent-kafka and the reader and writer (~0.5 s), and at
  its first conversion of Python values pyarrow imports pandas (~0.2–0.45 s of CPU, 350 modules).
  They are imported here once, before the daemon forks, and frozen out of the garbage collector
  (the worker collects after every task), so a worker starts with them. That matters beyond a
  server's first batch: Spark stops the idle workers of a daemon after a minute without tasks
  (``PythonWorkerFactory``), so after any pause the next batch runs on newly forked workers.

Set by :data:`airflow_eo.attempt.SPARK_APP_DEFAULTS` for the Spark applications airflow-eo
starts (spark-submit, ``airflow-eo connect-server``); a cluster's own servers read Kafka the
same way without it, only slower to start a task.
"""

from __future__ import annotations

import gc
import importlib
import os
import runpy
import sys
import zipimport


_invalidate_all = importlib.invalidate_caches
_static_archives: frozenset[str] = frozenset()  # the archives on sys.path when the daemon started


def invalidate_caches() -> None:
    """``importlib.invalidate_caches()`` but for the zip importers of the archives that were on
    ``sys.path`` when the daemon started (Spark's and Python's own), which are left as they are."""
    kept = {path: finder for path, finder in sys.path_importer_cache.items()
            if isinstance(finder, zipimport.zipimporter) and finder.archive in _static_archives}
    for path in kept:
        del sys.path_importer_cache[path]
    try:
        _invalidate_all()
    finally:
        sys.path_importer_cache.update(kept)


def preload() -> None:
    """What every read task imports, imported once in the daemon (workers are forked from it)."""
    for module in ("pyarrow", "pyarrow.compute", "pyarrow.parquet", "confluent_kafka",
                   "airflow_eo.driver.reader", "airflow_eo.driver.writer", "pyspark.worker"):
        try:
            importlib.import_module(module)
        except ImportError:  # a worker without it fails the task with the import error itself
            pass
    try:  # pyarrow's lazy pandas shim, as the reader's first conversion would load it (no thread starts)
        import pyarrow

        pyarrow.array([0])
    except ImportError:
        pass


if __name__ == "__main__":
    _static_archives = frozenset(p for p in sys.path if os.path.isfile(p))  # zips and jars, not directories
    importlib.invalidate_caches = invalidate_caches
    preload()
    gc.freeze()  # the preloaded modules' objects: never scanned by the workers' per-task gc.collect()
    sys.argv = ["pyspark.daemon", *sys.argv[1:]]
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=False)
