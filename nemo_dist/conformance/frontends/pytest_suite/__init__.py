"""The conformance checks as a pytest suite anyone can run:
``pytest --pyargs nemo_dist.conformance.frontends.pytest_suite``.

Its conftest loads the front end (:mod:`nemo_dist.conformance.frontends.pytest_plugin`,
which loads the harness plugin, :mod:`nemo_dist.testing.plugin`), so the
checks run from an installed package in any project, with the
``--conformance-*`` options naming what to check.
"""
