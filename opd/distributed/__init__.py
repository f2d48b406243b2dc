"""Environment workers on Ray (runner.workers > 1): `cluster` starts or joins the cluster,
`worker` is the actor that generates groups, `source` spreads the run's groups over the workers."""
