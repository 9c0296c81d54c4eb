"""Where the page lives: its mount under Airflow's API server and its route in Airflow's UI (no imports).

The plugin (:mod:`airflow_eo.ui.plugin`) registers them; the app's error pages
(:mod:`airflow_eo.ui.errors`) link back to the UI's route with them.
"""

URL_PREFIX = "/airflow-eo"  # the app's mount under the API server's base URL
URL_ROUTE = "exactly-once-tables"  # the UI's route of the navigation entry: <base>/plugin/<URL_ROUTE>
NAME = "Exactly-once tables"
