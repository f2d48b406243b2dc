"""What the hostile tests share: the jail's limits for them, where an escape would land, the secret
in the environment, tool calls through the toolbox, the coding task and its forgeries, the corpus
of hostile programs."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest

from conftest import ROOT, sandbox_limits
from opd.tools import workspace as workspace_tools
from opd.tools.registry import Toolbox
from opd.tools.workspace import Workspace


LIMITS = sandbox_limits(timeout_s=4, cpu_s=3, memory_mb=512, file_size_mb=8, max_processes=16, output_chars=500)
ESCAPE = ROOT / "opd-hostile-escape.txt"
SECRET = "opd-hostile-secret-7f3a"
LAUNCHER = os.getpid()
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="distinct uids per rollout need a root launcher")


def call(tools: Toolbox, name: str, **arguments: str) -> str:
    return asyncio.run(tools.run(name, arguments)).as_text()


@contextlib.contextmanager
def workspace(limits=LIMITS, **kwargs):
    ws = Workspace(limits, **kwargs)
    try:
        yield ws, Toolbox(workspace_tools.TOOLS, ws)
    finally:
        asyncio.run(ws.close())


def _sleepers() -> list[str]:
    """Processes the corpus may have left: `sleep 987`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                if "sleep 987" in cmdline:
                    found.append(f"{entry.name}: {cmdline}")
    return found



TESTS = "from solution import add_3\nassert add_3(1) == 4\nassert add_3(-3) == 0\nprint('All tests passed!')\n"
GOOD = "def add_3(x):\n    return x + 3\n"
FORGERIES = {
    "prints_success_and_exits_0": "print('All tests passed!')\nimport sys\nsys.exit(0)\n",
    "exits_0_at_import": "import os\nos._exit(0)\n",
    "exits_0_in_the_call": "def add_3(x):\n    import os\n    os._exit(0)\n",
    "returns_an_object_equal_to_everything": "class Yes:\n    def __eq__(self, other):\n        return True\ndef add_3(x):\n    return Yes()\n",
    "patches_assert_and_builtins": "import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})\nbuiltins.print = lambda *a, **k: None\ndef add_3(x):\n    return 0\n",
    "writes_its_own_tests": "open('test_solution.py', 'w').write('pass')\nopen('tests.py', 'w').write('pass')\ndef add_3(x):\n    return 0\n",
    "reads_the_tests_to_cheat": "import glob\nprint(glob.glob('/**/tests.py', recursive=True))\ndef add_3(x):\n    return 0\n",
    "forges_protocol_answers": "import os\nfor fd in range(3, 40):\n    try:\n        os.write(fd, b'{\"value\": 4}\\n{\"value\": 0}\\n')\n    except OSError:\n        pass\ndef add_3(x):\n    return 0\n",
    "kills_everything_it_sees": "import os, signal\nfor p in range(1, 400):\n    try:\n        os.kill(p, signal.SIGKILL)\n    except OSError:\n        pass\ndef add_3(x):\n    return 0\n",
    "sleeps_forever": "def add_3(x):\n    import time\n    time.sleep(600)\n",
}



CORPUS = {
    "infinite_loop": "while True:\n    pass\n",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "memory_bomb": "block = bytearray(8 * 1024 ** 3)\n",
    "disk_filler": "with open('filler.bin', 'wb') as f:\n    while True:\n        f.write(b'0' * 2 ** 20)\n",
    "gigantic_output": "import sys\nwhile True:\n    sys.stdout.write('x' * 2 ** 20)\n",
    "write_outside_absolute": "open({escape!r}, 'w').write('escaped')\n",
    "symlink_out": "import os\nos.symlink({escape!r}, 'link')\nopen('link', 'w').write('escaped')\n",
    "read_parent_environment": "import os\nprint(open('/proc/{pid}/environ', 'rb').read())\n",
    "print_the_environment": "import os\nprint(dict(os.environ))\nraise SystemExit(4)\n",
    "kill_the_launcher": "import os, signal\nos.kill({pid}, signal.SIGKILL)\n",
    "network": "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\n",
    "background_process": "import subprocess\nsubprocess.Popen(['sleep', '987'], start_new_session=True)\nraise SystemExit(5)\n",
    "double_fork_daemon": "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execvp('sleep', ['sleep', '987'])\n    os._exit(0)\nraise SystemExit(6)\n",
    "sleep_past_timeout": "import time\ntime.sleep(600)\n",
    "raise_limits": "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (10**6, 10**6))\n",
    "shm_filler": "open('/dev/shm/x', 'wb').write(b'0' * 2 ** 30)\n",
}


def program(name: str) -> str:
    return CORPUS[name].format(pid=LAUNCHER, escape=str(ESCAPE), secret=SECRET)

