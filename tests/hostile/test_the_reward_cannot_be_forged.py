"""The coding reward's verdict is its own: no solution can forge a pass, and correct solutions keep
their credit whatever they print or however long they are (docs/guarantees.md, "Sandbox")."""

from __future__ import annotations

import asyncio

import pytest

from conftest import one_fast
from hostile.common import LIMITS, call, workspace, TESTS, GOOD, FORGERIES
from opd.rewards.coding import run_task_tests
from opd.rewards.harness import run_tests, wire

# The leftover check (hostile/conftest.py) scans the whole machine: these tests run on one xdist worker.
pytestmark = pytest.mark.xdist_group("hostile")

# ---- the coding reward's verdict ------------------------------------------------------


@pytest.mark.parametrize("name", one_fast(sorted(FORGERIES), ("writes_its_own_tests",)))
def test_no_solution_can_forge_a_pass(name: str) -> None:
    with workspace() as (ws, tools):
        call(tools, "write_file", path="solution.py", content=FORGERIES[name])
        outcome = asyncio.run(run_task_tests(ws, TESTS, LIMITS, 200_000))
    assert outcome.level in ("assertion", "crash"), (name, outcome)


@pytest.mark.slow
def test_correct_solutions_pass_however_much_they_print_and_however_long_they_are() -> None:
    loud = "print('x' * 5_000_000)\nimport sys\nsys.stderr.write('y' * 5_000_000)\n" + GOOD
    long = GOOD + "# padding\n" * 5000  # 55,000 characters: over env.max_file_chars, under reward.max_solution_chars
    with workspace(max_file_chars=20_000) as (ws, tools):
        for source in (loud, long):
            assert "exit code 0" in call(tools, "terminal", command=f"python -c \"import sys; open('solution.py', 'w').write(sys.stdin.read())\" <<'EOF'\n{source}EOF")
            assert asyncio.run(run_task_tests(ws, TESTS, LIMITS, 200_000)).level == "pass"
        outcome = asyncio.run(run_task_tests(ws, TESTS, LIMITS, 50_000))
        assert outcome.level == "crash" and "max_solution_chars" in outcome.detail  # its own setting


STAR_FORGERIES = {
    # (solution.py, tests): each solution's add_3 is wrong; what else it exports must not help it.
    "shadows_a_builtin": ("def add_3(x):\n    return 0\ndef abs(x):\n    return 0\n", "from solution import *\nassert abs(add_3(1) - 4) == 0\n"),
    "exports_dunder_name": ("__all__ = ['add_3', '__name__']\ndef add_3(x):\n    return 0\n",
                            "from solution import *\nif __name__ == '__main__':\n    assert add_3(1) == 4\n"),
    "replaces_a_helper_of_the_tests": ("def add_3(x):\n    return 0\ndef expected(x):\n    return 0\n",
                                       "def expected(x):\n    return x + 3\nfrom solution import *\nassert add_3(1) == expected(1)\n"),
    "replaces_an_import_of_the_tests": ("def add_3(x):\n    return 0\ndef eq(a, b):\n    return True\n",
                                        "from operator import eq\nfrom solution import *\nassert eq(add_3(1), 4)\n"),
    "replaces_a_value_of_the_tests": ("EXPECTED = 0\ndef add_3(x):\n    return 0\n", "EXPECTED = 4\nfrom solution import *\nassert add_3(1) == EXPECTED\n"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STAR_FORGERIES))
def test_a_star_import_gives_the_tests_no_builtin_dunder_or_name_of_their_own(name: str) -> None:
    solution, tests = STAR_FORGERIES[name]
    outcome = asyncio.run(run_tests(solution, tests, LIMITS))
    assert outcome.level == "assertion", (name, outcome)


@pytest.mark.slow
def test_a_library_module_that_exits_on_import_is_a_crash_not_the_tests_verdict() -> None:
    """The solution names a module the tests' side imports for its names; one that raises
    SystemExit there (exit 0 would read as the tests finishing) is reported as what it is."""
    solution = "import types\nrunner = types.ModuleType('unittest.__main__')\ndef add_3(x):\n    return 0\n"
    outcome = asyncio.run(run_tests(solution, TESTS, LIMITS))
    assert outcome.level == "crash" and "importing the solution's names exited" in outcome.detail, outcome


@pytest.mark.slow
def test_the_tests_still_get_the_solutions_functions_by_star_or_by_name() -> None:
    star = "from solution import *\nassert add_3(1) == 4 and LIMIT == 7\n"
    assert asyncio.run(run_tests(GOOD + "LIMIT = 7\n", star, LIMITS)).level == "pass"
    assert asyncio.run(run_tests("__all__ = []\n" + GOOD, TESTS, LIMITS)).level == "pass"  # by name, whatever __all__ says


@pytest.mark.slow
def test_humaneval_helpers_come_from_the_prompt_not_from_the_solution() -> None:
    from opd.data.humaneval import humaneval_tasks

    tasks = {t["id"]: t for t in humaneval_tasks()}
    assert not any("import *" in t["test_code"] for t in tasks.values())
    # find_zero's tests check the zero with the prompt's `poly`: a solution's `poly` is not used.
    task = tasks["HumanEval/32"]
    forged = "def find_zero(xs):\n    return 0.0\ndef poly(xs, x):\n    return 0.0\n"
    assert asyncio.run(run_tests(forged, task["test_code"], LIMITS)).level == "assertion"
    assert asyncio.run(run_tests(task["solution"], task["test_code"], LIMITS)).level == "pass"


@pytest.mark.slow
def test_integers_of_any_size_cross_the_harness() -> None:
    solution = "def power_of_two(n):\n    return 2 ** n\ndef bits(n):\n    return n.bit_length()\n"
    tests = "from solution import power_of_two, bits\nassert power_of_two(20000) == 2 ** 20000\nassert bits(-10 ** 5000) == (10 ** 5000).bit_length()\n"
    assert asyncio.run(run_tests(solution, tests, LIMITS)).level == "pass"
    values = [2 ** 20000, -(10 ** 5000), {"k": (3 ** 9000, [7])}, 2 ** 1024, -(2 ** 1024) + 1, 0, True]
    assert wire.decode(wire.loads(wire.dumps({"v": wire.encode(values)}))["v"]) == values
    with pytest.raises(ValueError):  # a decimal number past CPython's digit limit is refused, not converted
        wire.loads('{"value": ' + "9" * 5000 + "}")
