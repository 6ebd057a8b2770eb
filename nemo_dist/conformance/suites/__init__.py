"""The suites: one folder per component checked, each registering its checks with the engine when imported.

Which suites the bundled run loads, in order, is :data:`~nemo_dist.conformance.engine.declarations.SUITE_PACKAGES`.
A suite imports the engine (and the harness), never a front end or another suite's folder.
"""
