"""``pytest conformance/``: the conformance suite's pytest front end (:mod:`nemo_dist.conformance.pytest_plugin`)."""

pytest_plugins = ["nemo_dist.conformance.pytest_plugin"]
