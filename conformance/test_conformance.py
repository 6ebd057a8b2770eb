"""``pytest conformance/`` from a clone: the installed suite's one test
(:mod:`nemo_dist.conformance.frontends.pytest_suite`)."""

from nemo_dist.conformance.frontends.pytest_suite.test_conformance import test_check_holds

__all__ = ["test_check_holds"]
