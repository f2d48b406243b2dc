"""No tool holds the event loop, whatever its arguments: a fuzz test per tool and one over the
coding reward's forgeries, measured in loop CPU (tests/stalls.py; docs/guarantees.md, "Sandbox")."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

from conftest import sandbox_limits
from hostile.common import LIMITS, call, workspace, TESTS, FORGERIES, CORPUS, program
from stalls import STALL_LIMIT_S, Stalls, measure
from opd.rewards.coding import run_task_tests
from opd.tools import math_tools
from opd.tools.calculator import CalculatorLimits
from opd.tools.registry import Toolbox

# The leftover check (hostile/conftest.py) scans the whole machine: these tests run on one xdist worker.
pytestmark = pytest.mark.xdist_group("hostile")

# ---- no tool holds the event loop, whatever its arguments ------------------------
# Each test fuzzes one tool's arguments (hypothesis, with known attacks first) through the toolbox
# the environments use, while a ticker on the loop measures how long it was held
# (tests/stalls.py). The limit and the worst stall are printed.


FUNCTIONS = ["sqrt", "exp", "log", "log10", "log2", "sin", "cos", "tan", "asin", "acos", "atan", "floor", "ceil", "fabs", "factorial",
             "gcd", "lcm", "comb", "perm", "abs", "round", "min", "max", "math.sqrt"]
NUMBERS = st.one_of(st.integers(-10**120, 10**120).map(str), st.floats(allow_nan=False).map(repr), st.sampled_from(["pi", "e", "tau", "-10**9", "10**7", "-10**7"]))
EXPRESSIONS = st.recursive(
    NUMBERS,
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "//", "%", "**"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(FUNCTIONS), st.lists(inner, min_size=1, max_size=3)).map(lambda t: f"{t[0]}({', '.join(t[1])})"),
        inner.map(lambda x: f"-{x}"),
    ),
    max_leaves=6,
)
# Each of these took seconds (or did not return) on the event loop, or is the largest allowed case.
CALCULATOR_ATTACKS = ["round(1, -10**7)", "round(1, -10**9)", "round(-7, -(10**8))", "round(10**99, -10**6)", "comb(10000, 5000)",
                      "perm(10000, 10000)", "factorial(170)", "9**9**9", "lcm(10**99 + 1, 10**99 - 1)", "round(1.5, -10**9)", "round(2.5, 10**9)",
                      # the fresh-eyes round (each held): the largest products, literals and quotients allowed
                      "comb(10000, 5000) * comb(10000, 5000)", "lcm(" + ", ".join(str(10_000 - i) for i in range(14)) + ")", "0x" + "f" * 190,
                      "round(10**100, -400)", "10**100 // 1e-300", "-" * 190 + "1", "(" * 90 + "1" + ")" * 90]


def _tool_stalls(capsys: pytest.CaptureFixture, name: str, stalls: Stalls) -> None:
    with capsys.disabled():
        print(f"\n{stalls.report(name)}")
    assert stalls.cpu_s < STALL_LIMIT_S, stalls.report(name)


@pytest.mark.slow
def test_the_calculator_never_holds_the_event_loop(capsys: pytest.CaptureFixture) -> None:
    tools = Toolbox(math_tools.TOOLS, math_tools.MathTools(CalculatorLimits(), LIMITS))
    stalls = Stalls()

    def one(expr: str) -> None:
        outcome = measure(stalls, expr, lambda: tools.run("calculator", {"expr": expr}))
        assert outcome.status in ("ok", "error"), outcome
        assert stalls.cpu_s < STALL_LIMIT_S, stalls.report("calculator")

    for attack in CALCULATOR_ATTACKS:
        one(attack)

    @settings(max_examples=400, deadline=None)
    @given(EXPRESSIONS)
    def fuzz(expr: str) -> None:
        one(expr)

    fuzz()
    _tool_stalls(capsys, "calculator", stalls)
    assert "above" in asyncio.run(tools.run("calculator", {"expr": "round(1, -10**7)"})).as_text()


FAST_LIMITS = sandbox_limits(timeout_s=3, cpu_s=2, memory_mb=256, file_size_mb=8, max_processes=16, output_chars=500, workspace_mb=32)
PROGRAMS = st.one_of(
    st.sampled_from(sorted(CORPUS)).map(program),
    st.text(max_size=300),
    st.tuples(st.sampled_from(["print", "raise SystemExit", "x ="]), st.text(max_size=50)).map(lambda t: f"{t[0]}({t[1]!r})"),
)


@pytest.mark.slow
def test_the_python_tool_never_holds_the_event_loop(capsys: pytest.CaptureFixture) -> None:
    tools = Toolbox(math_tools.TOOLS, math_tools.MathTools(CalculatorLimits(), FAST_LIMITS))
    stalls = Stalls()
    attacks = ["gigantic_output", "fork_bomb", "disk_filler", "double_fork_daemon"]
    many_files = "import os\nfor i in range(20000):\n    os.close(os.open(str(i), os.O_CREAT | os.O_WRONLY))\n"
    binary_output = "import os, sys\nsys.stdout.buffer.write(os.urandom(3_000_000))\n"
    for code in [program(name) for name in attacks] + [many_files, binary_output]:
        assert measure(stalls, code, lambda: tools.run("python_interpreter", {"code": code})).ran

    @settings(max_examples=12, deadline=None)
    @given(PROGRAMS)
    def fuzz(code: str) -> None:
        assert measure(stalls, code, lambda: tools.run("python_interpreter", {"code": code})).ran

    fuzz()
    _tool_stalls(capsys, "python_interpreter", stalls)


@pytest.mark.slow
def test_the_coding_reward_never_holds_the_event_loop(capsys: pytest.CaptureFixture) -> None:
    # The math reward's checker has its own ticker test (test_boxed.py::test_a_hostile_answer_*).
    stalls = Stalls()
    with workspace(FAST_LIMITS) as (ws, tools):
        for name, solution in sorted(FORGERIES.items()):
            call(tools, "write_file", path="solution.py", content=solution)
            measure(stalls, name, lambda: run_task_tests(ws, TESTS, FAST_LIMITS, 200_000))
    _tool_stalls(capsys, "coding reward (the task's tests)", stalls)


PATHS = st.one_of(st.text(max_size=40), st.lists(st.sampled_from(["a", "..", ".", "", "d", "x" * 300, "\x00", "solution.py"]), max_size=8).map("/".join),
                  st.just("d/" * 2000 + "f"))
CONTENTS = st.one_of(st.text(max_size=200), st.integers(0, 60_000).map(lambda n: "x" * n), st.just("\n" * 19_999))


def test_the_file_tools_never_hold_the_event_loop(capsys: pytest.CaptureFixture) -> None:
    stalls = Stalls()
    with workspace(FAST_LIMITS) as (ws, tools):
        assert "exit code 0" in call(tools, "terminal", command="mkfifo fifo; head -c 5000000 /dev/zero > big; seq 1 4000 > lines; echo ok")

        @settings(max_examples=150, deadline=None)
        @given(st.sampled_from(["write_file", "read_file", "patch"]), PATHS, CONTENTS, CONTENTS)
        def fuzz(name: str, path: str, content: str, other: str) -> None:
            arguments = {"write_file": {"path": path, "content": content}, "read_file": {"path": path},
                         "patch": {"path": path, "old": content, "new": other}}[name]
            measure(stalls, f"{name} {path[:30]}", lambda: tools.run(name, arguments))

        for path in ("fifo", "big", "lines", "d/" * 2000 + "f"):
            measure(stalls, f"read_file {path[:30]}", lambda: tools.run("read_file", {"path": path}))
            measure(stalls, f"patch {path[:30]}", lambda: tools.run("patch", {"path": path, "old": "1\n" * 5000, "new": "y" * 20_000}))
        fuzz()
    _tool_stalls(capsys, "write_file / read_file / patch", stalls)


COMMANDS = st.one_of(
    st.sampled_from([
        "python -c \"import os\nfor i in range(20000):\n    os.close(os.open(str(i), os.O_CREAT | os.O_WRONLY))\"",
        "head -c 3000000 /dev/urandom", "yes | head -c 20000000", "for i in $(seq 1 400); do mkdir d; cd d; done; touch f",
        "head -c 100000000 /dev/zero > big", "cat /dev/zero", ":(){ :|:& };:", "sleep 100 & disown", "kill -SEGV $$",
    ]),
    st.text(max_size=200),
)


@pytest.mark.slow
def test_the_terminal_never_holds_the_event_loop(capsys: pytest.CaptureFixture) -> None:
    stalls = Stalls()
    with workspace(FAST_LIMITS) as (_, tools):

        @settings(max_examples=16, deadline=None)
        @given(COMMANDS)
        def fuzz(command: str) -> None:
            measure(stalls, command, lambda: tools.run("terminal", {"command": command}))

        fuzz()
    _tool_stalls(capsys, "terminal", stalls)
