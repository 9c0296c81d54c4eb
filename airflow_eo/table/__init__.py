"""The Delta side: the ledger (what a table committed), the plan log, staged files, the
compare-and-set commit, the table's schema and where tables live."""
