"""The engine: what is checked, the registry of checks, the worlds that run them, verdicts and reports.

It knows no suite by its code: a suite registers its checks (:mod:`.registry`) and declares its options and its
component (:mod:`.declarations`). Nothing here imports a suite or a front end.
"""
