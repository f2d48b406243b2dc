"""The OPD experiment in plain PyTorch: an implementation of sampling, tool calls, the three losses
and the held-out evaluation that shares no serving, rollout or trainer code with the project
(`loop.py` imports only torch, transformers and the project's calculator), so that a result of
`experiment=opd_vs_grpo` can be checked against it, and so that budgets this machine cannot afford
(hundreds of optimiser steps of 64 rollouts) run in minutes on one GPU. `bundle.py` writes the
prompts as the project's env renders them; `sweep.py` runs arms side by side; `report.py` reads
the results. docs/opd.md has the commands and the result."""
