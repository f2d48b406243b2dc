"""Benchmarks (`python -m experiments.bench <name>`): a scripted loopback server and the measurements."""
