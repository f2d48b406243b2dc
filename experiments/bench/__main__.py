"""`python -m experiments.bench NAME`: see `experiments.bench.cli`."""

from experiments.bench.cli import main

raise SystemExit(main())
