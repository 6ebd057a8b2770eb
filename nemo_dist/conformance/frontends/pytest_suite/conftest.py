"""Loads the conformance front end for the suite beside it (a conftest of the initial path may name plugins)."""

pytest_plugins = ["nemo_dist.conformance.frontends.pytest_plugin"]
