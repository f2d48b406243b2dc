"""Run arms of the plain OPD experiment side by side, one process each, for the same wall time.

    python -m experiments.opd_plain.sweep --bundle bundle.json --out results/ --wall-s 420 \
        --runs grpo:1e-4:0 opd:1e-4:0 opd_full:1e-4:0 mix:1e-4:0

Each run is `arm:learning_rate:seed`; the first run also evaluates the teacher (the ceiling). Every
run stops at `--steps` or when its wall time is spent, after a last evaluation, so a sweep ends in
a known time whatever the machine's speed (and reports how many steps each arm took).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger(__name__)


def run_name(spec: str) -> str:
    """`opd:1e-4:0` -> `opd_lr1e-4_s0` (a file name)."""
    arm, lr, seed = spec.split(":")
    return f"{arm}_lr{lr}_s{seed}"


def commands(bundle: Path, out: Path, runs: list[str], wall_s: float, extra: list[str]) -> list[tuple[str, list[str]]]:
    """(run name, argv) of each run: `experiments.opd_plain.loop` with its arm, learning rate and
    seed, the shared wall time and `extra`; the first also evaluates the teacher."""
    argvs = []
    for i, spec in enumerate(runs):
        arm, lr, seed = spec.split(":")
        name = run_name(spec)
        argvs.append((name, [sys.executable, "-m", "experiments.opd_plain.loop", "--bundle", str(bundle), "--arm", arm, "--lr", lr, "--seed", seed,
                             "--wall-s", str(wall_s), "--out", str(out / f"{name}.jsonl"), *(["--eval-teacher"] if i == 0 else []), *extra]))
    return argvs


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="a directory for each run's JSON lines and log")
    parser.add_argument("--runs", nargs="+", required=True, help="arm:learning_rate:seed, one process each")
    parser.add_argument("--wall-s", type=float, required=True, help="each run's wall time")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per process")
    parser.add_argument("extra", nargs="*", help="further arguments for every run (after --)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    procs = []
    for name, command in commands(args.bundle, args.out, args.runs, args.wall_s, args.extra):
        log = (args.out / f"{name}.log").open("w")
        procs.append((name, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    failed = []
    for name, proc, log in procs:
        code = proc.wait()
        log.close()
        if code != 0:
            failed.append(name)
            logger.error("%s exited %d (its log: %s)", name, code, args.out / f"{name}.log")
    logger.info("%d of %d runs finished", len(procs) - len(failed), len(procs))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
