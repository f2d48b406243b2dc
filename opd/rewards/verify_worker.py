"""A math-verify worker process (`python -m opd.rewards.verify_worker MEMORY_MB TIMEOUT_S`): one JSON
line [answer, reference] in on stdin, one line `true`/`false` out, until stdin closes. It prints
`ready` first, after its imports and one check of each kind (math-verify's first check of a
number, and of LaTeX, sets up caches and parsers: ~70 ms here), which are then part of no check's
time.

math-verify's own timeouts are a backstop at 3x the caller's hard one: a check that runs long is
cut by the caller (killed, counted, not cached) rather than answered False here (which could be
cached)."""

from __future__ import annotations

import json
import resource
import signal
import sys


def main() -> None:
    memory_mb, timeout_s = int(sys.argv[1]), int(sys.argv[2])
    # Slurm's warning signals reach every process of the job step; they are the run's to handle.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, memory_mb * 2**20))
    from math_verify import parse, verify

    def check(predicted: str, reference: str) -> bool:
        gold = parse(f"${reference}$", parsing_timeout=3 * timeout_s)
        guess = parse(f"${predicted}$", parsing_timeout=3 * timeout_s)
        return bool(gold and guess and verify(gold, guess, timeout_seconds=3 * timeout_s))

    for warm_up in (("4", "17"), ("0.5", "\\frac{1}{2}")):
        check(*warm_up)
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            ok = check(*json.loads(line))
        except Exception:  # the verifier raises a variety of errors on hostile input: not verified
            ok = False
        out.write("true\n" if ok else "false\n")
        out.flush()


if __name__ == "__main__":
    main()
