"""The suites: one folder per component checked, each registering its checks with the engine when imported.

A folder here with an ``options.py`` is a suite: the engine finds it (and its place, ``ORDER``) there
(:mod:`nemo_dist.conformance.engine.declarations`). A suite imports the engine, the adapters and the harness,
never a front end.
"""
