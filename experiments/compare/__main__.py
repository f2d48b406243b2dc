"""`python -m experiments.compare <sweep dir | parent run id>` (see experiments/compare/__init__.py)."""

from experiments.compare.report import main

raise SystemExit(main())
