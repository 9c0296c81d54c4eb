"""Submitters: how an attempt's Spark job is started.

* :class:`airflow_eo.submit.spark_submit.LocalSparkSubmit`: the installed ``spark-submit``
  as a child process (the CLI, tests);
* :class:`airflow_eo.submit.spark_hook.SparkSubmitHookSubmitter`: Airflow's SparkSubmitHook
  with a ``spark`` connection (the operator);
* :class:`airflow_eo.driver.main.InProcessSubmitter`: a SparkSession of this process.

Each implements the loop's :class:`airflow_eo.loop.runner.Submitter` protocol and runs the same
job (:mod:`airflow_eo.driver.main`) with the same arguments and secret-carrying environment.
"""
