"""The front ends: the command (:mod:`.cli`), torchrun mode (:mod:`.inworld`) and pytest (:mod:`.pytest_plugin`,
the shipped suite :mod:`.pytest_suite`). Each reads the one option table and runs the engine's checks."""
