"""Built-in coding tasks: the reference design's eight tasks and a seeded generator of small ones.

A task is `{"id", "task", "test_code", "entry_point", "solution"}`: `test_code` imports the entry
point, and nothing else, from `solution` and raises on failure; `solution` is a known-good answer
(used to check the tests and to train the fixture model), never shown to the agent.
"""

from __future__ import annotations

import random
import textwrap

Task = dict[str, str]


def _task(task_id: str, task: str, entry_point: str, asserts: list[str], solution: str) -> Task:
    test_code = f"from solution import {entry_point}\n" + "".join(f"{a}\n" for a in asserts) + "print('All tests passed!')\n"
    return {"id": task_id, "task": task, "test_code": test_code, "entry_point": entry_point, "solution": textwrap.dedent(solution).lstrip()}


REFERENCE_TASKS: list[Task] = [
    _task(
        "ref-fizzbuzz",
        "Write a Python function `fizzbuzz(n)` that returns a list of strings from 1 to n. For multiples of 3 "
        "return 'Fizz', for multiples of 5 return 'Buzz', for multiples of both return 'FizzBuzz', otherwise "
        "the number as a string.",
        "fizzbuzz",
        ["assert fizzbuzz(15) == ['1','2','Fizz','4','Buzz','Fizz','7','8','Fizz','Buzz','11','Fizz','13','14','FizzBuzz']",
         "assert fizzbuzz(1) == ['1']", "assert fizzbuzz(0) == []"],
        """
        def fizzbuzz(n):
            out = []
            for i in range(1, n + 1):
                if i % 15 == 0:
                    out.append('FizzBuzz')
                elif i % 3 == 0:
                    out.append('Fizz')
                elif i % 5 == 0:
                    out.append('Buzz')
                else:
                    out.append(str(i))
            return out
        """,
    ),
    _task(
        "ref-is-palindrome",
        "Write a Python function `is_palindrome(s)` that checks if a string is a palindrome, ignoring case and "
        "non-alphanumeric characters. Return True or False.",
        "is_palindrome",
        ["assert is_palindrome('A man, a plan, a canal: Panama') == True", "assert is_palindrome('race a car') == False",
         "assert is_palindrome('') == True", "assert is_palindrome('Was it a car or a cat I saw?') == True"],
        """
        def is_palindrome(s):
            t = [c.lower() for c in s if c.isalnum()]
            return t == t[::-1]
        """,
    ),
    _task(
        "ref-two-sum",
        "Write a Python function `two_sum(nums, target)` that returns the indices of the two numbers in `nums` "
        "that add up to `target`. Assume exactly one solution exists. Return a list of two indices [i, j] where i < j.",
        "two_sum",
        ["assert two_sum([2, 7, 11, 15], 9) == [0, 1]", "assert two_sum([3, 2, 4], 6) == [1, 2]", "assert two_sum([3, 3], 6) == [0, 1]"],
        """
        def two_sum(nums, target):
            seen = {}
            for j, x in enumerate(nums):
                if target - x in seen:
                    return [seen[target - x], j]
                seen[x] = j
        """,
    ),
    _task(
        "ref-flatten",
        "Write a Python function `flatten(lst)` that takes an arbitrarily nested list and returns a flat list of "
        "all elements. For example, flatten([1, [2, [3, 4], 5]]) should return [1, 2, 3, 4, 5].",
        "flatten",
        ["assert flatten([1, [2, [3, 4], 5]]) == [1, 2, 3, 4, 5]", "assert flatten([]) == []", "assert flatten([1, 2, 3]) == [1, 2, 3]",
         "assert flatten([[[[1]]]]) == [1]", "assert flatten([1, [2], [[3]], [[[4]]]]) == [1, 2, 3, 4]"],
        """
        def flatten(lst):
            out = []
            for x in lst:
                if isinstance(x, list):
                    out.extend(flatten(x))
                else:
                    out.append(x)
            return out
        """,
    ),
    _task(
        "ref-longest-common-prefix",
        "Write a Python function `longest_common_prefix(strs)` that finds the longest common prefix string amongst "
        "a list of strings. If there is no common prefix, return an empty string.",
        "longest_common_prefix",
        ["assert longest_common_prefix(['flower', 'flow', 'flight']) == 'fl'", "assert longest_common_prefix(['dog', 'racecar', 'car']) == ''",
         "assert longest_common_prefix(['interspecies', 'interstellar', 'interstate']) == 'inters'",
         "assert longest_common_prefix(['a']) == 'a'", "assert longest_common_prefix([]) == ''"],
        """
        def longest_common_prefix(strs):
            if not strs:
                return ''
            prefix = strs[0]
            for s in strs[1:]:
                while not s.startswith(prefix):
                    prefix = prefix[:-1]
            return prefix
        """,
    ),
    _task(
        "ref-group-anagrams",
        "Write a Python function `group_anagrams(strs)` that groups anagrams together. Return a list of lists, "
        "where each inner list contains strings that are anagrams of each other. The order of groups and strings "
        "within groups does not matter.",
        "group_anagrams",
        ["result = group_anagrams(['eat', 'tea', 'tan', 'ate', 'nat', 'bat'])",
         "assert sorted([sorted(g) for g in result]) == [['ate', 'eat', 'tea'], ['bat'], ['nat', 'tan']]",
         "assert group_anagrams([]) == []", "assert group_anagrams(['a']) == [['a']]"],
        """
        def group_anagrams(strs):
            groups = {}
            for s in strs:
                groups.setdefault(''.join(sorted(s)), []).append(s)
            return list(groups.values())
        """,
    ),
    _task(
        "ref-valid-parentheses",
        "Write a Python function `valid_parentheses(s)` that determines if a string containing just '(', ')', '{', "
        "'}', '[' and ']' is valid. A string is valid if open brackets are closed by the same type and in the "
        "correct order.",
        "valid_parentheses",
        ["assert valid_parentheses('()') == True", "assert valid_parentheses('()[]{}') == True", "assert valid_parentheses('(]') == False",
         "assert valid_parentheses('([)]') == False", "assert valid_parentheses('{[]}') == True", "assert valid_parentheses('') == True"],
        """
        def valid_parentheses(s):
            pairs = {')': '(', ']': '[', '}': '{'}
            stack = []
            for c in s:
                if c in pairs:
                    if not stack or stack.pop() != pairs[c]:
                        return False
                else:
                    stack.append(c)
            return not stack
        """,
    ),
    _task(
        "ref-merge-intervals",
        "Write a Python function `merge_intervals(intervals)` that merges overlapping intervals. Each interval is a "
        "list [start, end]. Return the merged intervals sorted by start time.",
        "merge_intervals",
        ["assert merge_intervals([[1,3],[2,6],[8,10],[15,18]]) == [[1,6],[8,10],[15,18]]", "assert merge_intervals([[1,4],[4,5]]) == [[1,5]]",
         "assert merge_intervals([[1,4],[0,4]]) == [[0,4]]", "assert merge_intervals([]) == []", "assert merge_intervals([[1,2]]) == [[1,2]]"],
        """
        def merge_intervals(intervals):
            out = []
            for start, end in sorted(intervals):
                if out and start <= out[-1][1]:
                    out[-1][1] = max(out[-1][1], end)
                else:
                    out.append([start, end])
            return out
        """,
    ),
]

_OPERATIONS = [
    ("add_{k}", "returns `x` plus {k}", "x + {k}", lambda x, k: x + k),
    ("times_{k}", "returns `x` multiplied by {k}", "x * {k}", lambda x, k: x * k),
    ("minus_{k}", "returns `x` minus {k}", "x - {k}", lambda x, k: x - k),
    ("mod_{k}", "returns the remainder of `x` divided by {k}", "x % {k}", lambda x, k: x % k),
    ("square_plus_{k}", "returns the square of `x` plus {k}", "x * x + {k}", lambda x, k: x * x + k),
]


def generated_tasks(n: int = 120, seed: int = 7) -> list[Task]:
    """`n` distinct one-line function tasks (e.g. `add_3(x)` returns x + 3) with three asserts each."""
    rng = random.Random(seed)
    tasks: dict[str, Task] = {}
    while len(tasks) < n:
        name_t, text_t, expr_t, fn = rng.choice(_OPERATIONS)
        k = rng.randint(2, 30)
        name, expr = name_t.format(k=k), expr_t.format(k=k)
        if name in tasks:
            continue
        xs = rng.sample(range(-20, 50), 3)
        asserts = [f"assert {name}({x}) == {fn(x, k)}" for x in xs]
        tasks[name] = _task(f"gen-{name}", f"Write a Python function `{name}(x)` that {text_t.format(k=k)}.", name, asserts,
                            f"def {name}(x):\n    return {expr}\n")
    return list(tasks.values())


def builtin_tasks() -> list[Task]:
    """The reference's eight tasks followed by the generated ones (the default coding set), each
    with its `kind` (reference or generated) for per-kind evaluation."""
    return [{**t, "kind": "reference"} for t in REFERENCE_TASKS] + [{**t, "kind": "generated"} for t in generated_tasks()]
