"""Tests of the multi-process harness (nemo_dist.testing)."""
