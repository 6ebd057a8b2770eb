"""``python -m nemo_dist.conformance``: the command line (:mod:`nemo_dist.conformance.frontends.cli`)."""

import sys

from nemo_dist.conformance.frontends.cli import main

sys.exit(main())
