"""Shared pytest configuration of the nemo_dist suite (keep it minimal)."""

pytest_plugins = ["pytester"]
