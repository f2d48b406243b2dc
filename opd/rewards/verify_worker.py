"""A math-verify worker process (`python -m opd.rewards.verify_worker MEMORY_MB TIMEOUT_S`): one JSON
line [answer, reference] in on stdin, one line `true`/`false` out, until stdin closes. It prints
`ready` first: its imports take a second or two and are not part of any check's time.

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

    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            predicted, reference = json.loads(line)
            gold = parse(f"${reference}$", parsing_timeout=3 * timeout_s)
            guess = parse(f"${predicted}$", parsing_timeout=3 * timeout_s)
            ok = bool(gold and guess and verify(gold, guess, timeout_seconds=3 * timeout_s))
        except Exception:  # the verifier raises a variety of errors on hostile input: not verified
            ok = False
        out.write("true\n" if ok else "false\n")
        out.flush()


if __name__ == "__main__":
    main()
