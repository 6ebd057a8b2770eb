"""How the suites call a user's target: a callable found by ``module:name`` and its signature filled (:mod:`.callables`,
:mod:`.signature`, :mod:`.symbols`), a ``--ddp-fn`` wrapper (:mod:`.wrapping`), a target that raised on some ranks
(:mod:`.target_raised`). Shared by several suites; above the engine, below every suite.
"""
