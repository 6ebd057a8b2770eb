"""``pytest conformance/``: the conformance suite's pytest front end
(:mod:`nemo_dist.conformance.frontends.pytest_plugin`)."""

pytest_plugins = ["nemo_dist.conformance.frontends.pytest_plugin"]
