"""Our environments run by atroposlib's own commands (`serve`, `process`): see `env.py`."""
