"""Run a command and take its whole process group down when our parent dies, even by SIGKILL.

`python guard.py CMD...`: LocalVLLM starts vLLM through this in a new process group (the guard
leads it). A killed launcher cannot stop its server, and the kernel's parent-death signal only
reaches vLLM's API process, not the engine process it spawns; the guard polls its parent and
kills the group when the parent is gone. SIGTERM/SIGINT are passed to the command; the guard
exits with the command's exit code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def main(argv: list[str]) -> int:
    parent = os.getppid()
    child = subprocess.Popen(argv)

    def forward(signum: int, frame: object) -> None:
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            return child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent:
            os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
