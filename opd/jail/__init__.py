"""The jail of model-written code: one bubblewrap call at a time, each in its own namespaces, as its
own uid, under its own limits, quotas and control group, ended when its processes are gone.

`sandbox` runs a jailed call step by step over the others: `command` (the command line: limits, a
PID namespace its leader reaps, bwrap), `uids` (a uid per workspace or call, leased), `call_dirs`
(the launcher's call directories), `tmpfs` (a size- and file-capped tmpfs per place), `cgroups`
(a control group per call), `reaping` (killing and reaping a jail), `capture` (its output and what
stopped it).
"""
