"""The "Exactly-once tables" page in Airflow's UI: an Airflow plugin shipped with the provider.

``plugin`` registers it (entry point ``airflow.plugins``), ``app`` serves it (FastAPI, behind
Airflow's authentication and auth manager), ``events`` finds the tables in Airflow's records,
``tables`` reads each table's Delta log, ``render`` and ``charts`` draw the HTML and SVG.
"""
