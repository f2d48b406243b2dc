"""A third environment, defined outside `opd/` with no framework edit (tests/test_third_env.py)."""
