"""The plain-PyTorch OPD experiment (experiments/opd_plain/): its tools answer as Python would and
never run anything else, its decoder's KV cache and forced tool responses give the same logprobs
as one full forward pass, one training step of each arm runs, and the report's gap closed and
reverse-KL change are what the evaluations say."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from experiments.opd_plain import report, sweep, tools
from experiments.opd_plain.bundle import make_bundle
from experiments.opd_plain.loop import ARMS, Row, kl_terms, load, loss_of, padded, run_arm, token_logprobs
from experiments.opd_plain.tools import answer_call, run_python

ROOT = Path(__file__).resolve().parents[1]

# Programs of the kinds the fixture writes (the inline_math problems' expressions).
PROGRAMS = [
    "print(31 ** 22)",
    "print(sum(k * k for k in (1, 2, 3)))",
    "print(len(str(12345)))",
    "print(sum(range(1, 7 + 1)))",
    "print(125 // 11)\nprint(7 % 2, 3 - 10)",
    "print(sum([x for x in range(10) if x % 3 == 0]))",
    "print(7 / 2)",
    # Beyond the fixture: Python's printing of tuples and ranges, its comprehension scopes, sums of lists.
    "print((1, 2), range(3), '-' * 3)",
    "print([[x for x in range(2)] + [x] for x in range(3)])",
    "print(sum([[1], [2]], []))",
    # A comprehension over the longest range with a sizeable body fits the step budget.
    "print(sum(k * k + 2 * k - 1 for k in range(100000) if k % 3 == 0))",
]


@pytest.mark.parametrize("code", PROGRAMS)
def test_the_python_tool_prints_what_python_prints(code: str) -> None:
    expected = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert run_python(code) == {"stdout": expected, "stderr": "", "exit_code": 0}


@pytest.mark.parametrize("code", [
    "import os\nprint(os.getcwd())",
    "print(open('/etc/passwd').read())",
    "print(__import__('os').system('touch /tmp/opd-plain-ran'))",
    "print((1).__class__)",
    "x = 1\nprint(x)",
    "print([x for x in range(3)], x)",
    "print(len('%0100000000d' % 1))",
])
def test_the_python_tool_never_runs_anything_else(code: str) -> None:
    result = run_python(code)
    assert result["exit_code"] == 1 and result["stdout"] == "" and result["stderr"]
    assert not Path("/tmp/opd-plain-ran").exists()


@pytest.mark.parametrize("code", ["print(10 ** 10 ** 10)", "print(sum(range(10 ** 12)))", "print(len(str(9 ** 128 * 9 ** 128)))",
                                  "print(len([0] * 10 ** 8))", "print(len([0] * 10 ** 18))"])
def test_the_python_tool_refuses_unbounded_work_at_once(code: str) -> None:
    started = time.process_time()
    result = run_python(code)
    assert result["exit_code"] == 1 and time.process_time() - started < 1.0


# Programs whose work grows past any bound while each part stays within the stated ones.
UNBOUNDED = [
    "print(len([[y for y in range(100000)] for x in range(100000)]))",
    "print(sum(sum(range(100000)) for x in range(100000)))",
    "print(len(sum([[x] for x in range(100000)], [])))",  # quadratic copying
    "print(len(str([[a] * 100 for a in [[b] * 100 for b in [[0] * 100]]])))",  # one list held many times
    "print([[[0] * 1000] * 1000] * 1000 == [[[0] * 1000] * 1000] * 1000)",
    "print(max([[[0] * 10000] * 10000] * 10000))",
    "print([[0] * 10 ** 4] * 10 ** 4)",
    "print(len('a' * 10 ** 8))",
]


@pytest.mark.parametrize("code", UNBOUNDED)
def test_the_python_tool_stops_a_program_at_its_step_budget(code: str) -> None:
    assert run_python(code, max_steps=20_000) == {"stdout": "", "stderr": "Unsupported: the program takes more than 20000 steps", "exit_code": 1}


def test_the_python_tools_output_is_cut_like_the_sandboxes() -> None:
    full = subprocess.run([sys.executable, "-c", "print(list(range(100000)))"], capture_output=True, text=True, check=True).stdout
    stdout = run_python("print([x for x in range(100000)])")["stdout"]
    assert stdout == full[:tools.MAX_OUTPUT_CHARS] + f"\n...[truncated at {tools.MAX_OUTPUT_CHARS} characters]"


@pytest.mark.parametrize("code", ["print(1e999)", "print(1e999 - 1e999)", "print(1e300)", "print(((-8) ** 0.5 * 10 ** 99) ** 2)"])
def test_the_python_tool_refuses_values_past_the_calculators_magnitude(code: str) -> None:
    assert run_python(code) == {"stdout": "", "stderr": "OverflowError: result too large", "exit_code": 1}


def test_the_python_tools_answer_is_text_the_tokenizer_reads() -> None:
    """A lone surrogate is an error, as printing it is in Python, not a str the tokenizer raises on."""
    result = answer_call(json.dumps({"name": "python_interpreter", "arguments": {"code": "print('\\ud800')"}}))
    assert result["exit_code"] == 1 and result["stderr"].startswith("UnicodeEncodeError")
    json.dumps(result, ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("body", ["[" * 100_000, '{"name": "calculator", "arguments": {"expr": "1"}, "n": 1' + "0" * 5000 + "}"])
def test_unreadable_json_is_answered_with_an_error(body: str) -> None:
    assert answer_call(body).keys() == {"error"}


def test_calls_are_answered_like_the_env_answers_them() -> None:
    assert answer_call('{"name": "calculator", "arguments": {"expr": "(2 + 3) * 4"}}') == {"value": 20}
    assert answer_call('{"name": "python_interpreter", "arguments": {"code": "print(32 ** 2)"}}')["stdout"] == "1024\n"
    assert answer_call('{"name": "calculator", "arguments": {"expr": "1 +"}}').keys() == {"error"}
    assert answer_call('{"name": "python_interpreter", "arguments": {"035 + 9"}}') == {
        "error": "tool call is not valid JSON: Expecting ':' delimiter (a hermes tool call)"}
    assert "error" in answer_call('{"name": "shell", "arguments": {"cmd": "ls"}}')


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Torch on one thread for this module's models: the suite runs a test per core, and two
    threads of each on busy cores wait on each other (the arm tests took 175-314 s at load 15, 3 s
    alone)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The experiment's items and prompts from the project's env, with a short generation budget."""
    data = make_bundle()
    data["limits"]["max_new_tokens"] = 48
    path = tmp_path_factory.mktemp("plain") / "bundle.json"
    path.write_text(json.dumps(data))
    return path


def test_the_bundle_holds_the_envs_split_and_prompts(bundle: Path) -> None:
    data = json.loads(bundle.read_text())
    assert (len(data["train"]), len(data["eval"])) == (360, 40)
    assert {it["id"] for it in data["train"]}.isdisjoint(it["id"] for it in data["eval"])
    assert data["tokens"]["call_end"] != data["tokens"]["eos"]
    assert all(it["prompt_ids"][-1] != data["tokens"]["eos"] for it in data["eval"])


def test_the_decoders_cache_and_forced_responses_give_the_full_forward_logprobs(bundle: Path) -> None:
    """Rows of different prompt lengths (left padding), tool responses fed as forced tokens: every
    sampled token's logprob at sampling equals the one full forward pass of the finished row."""
    setup = load(bundle, str(ROOT / "opd/fixture/student"), str(ROOT / "opd/fixture/teacher"), "cpu", eval_items=2)
    items = setup.bundle["train"][:3]
    assert len({len(it["prompt_ids"]) for it in items}) > 1
    generator = torch.Generator().manual_seed(3)
    rows = setup.decoder.generate(setup.student, [it["prompt_ids"] for it in items for _ in range(2)], [False] * 5 + [True], generator)
    forced = [not s for r in rows for s in r.sampled[r.prompt_len:]]
    assert any(forced), "no tool response was fed (the check below would not cover forced tokens)"
    ids, mask = padded(rows, setup.device)
    with torch.no_grad():
        lps = token_logprobs(setup.student, ids, mask)
    s, _, _, _ = kl_terms(lps, lps, ids[:, 1:][mask[:, 1:]])
    sampler = torch.tensor([lp for r in rows for lp in r.sampler_logprobs])
    assert torch.allclose(s, sampler, atol=1e-4), float((s - sampler).abs().max())
    for r in rows:
        assert r.finish in ("eos", "max_new_tokens", "tool_after_think"), r.finish
        assert len(r.tokens) == len(r.sampled) and sum(r.sampled) == len(r.sampler_logprobs)


def test_the_losses_are_the_reverse_kl_and_its_sampled_estimate() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 11, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(6, 11), -1)
    tokens = torch.randint(0, 11, (6,))
    student = torch.log_softmax(logits, -1)
    exact = (student.exp() * (student - teacher)).sum(-1).mean()
    assert torch.allclose(loss_of("opd_full", student, teacher, tokens, torch.zeros(6)), exact)
    advantage = (teacher.gather(-1, tokens[:, None])[:, 0] - student.gather(-1, tokens[:, None])[:, 0]).detach().clamp(-5, 5)
    (grad_opd,) = torch.autograd.grad(loss_of("opd", student, teacher, tokens, torch.zeros(6)), logits, retain_graph=True)
    (grad_ref,) = torch.autograd.grad(-(advantage * student.gather(-1, tokens[:, None])[:, 0]).mean(), logits, retain_graph=True)
    assert torch.allclose(grad_opd, grad_ref)
    reward_advantage = torch.tensor([1.0, -1.0, 0.5, 0.0, 2.0, -2.0])
    (grad_mix,) = torch.autograd.grad(loss_of("mix", student, teacher, tokens, reward_advantage), logits, retain_graph=True)
    (grad_grpo,) = torch.autograd.grad(loss_of("grpo", student, teacher, tokens, reward_advantage), logits)
    assert torch.allclose(grad_mix, grad_opd + grad_grpo, atol=1e-6)


@pytest.mark.parametrize("arm", ARMS)
def test_one_step_of_each_arm_writes_its_evaluations_and_step(bundle: Path, tmp_path: Path, arm: str) -> None:
    setup = load(bundle, str(ROOT / "opd/fixture/student"), str(ROOT / "opd/fixture/teacher"), "cpu", eval_items=1)
    before = [p.detach().clone() for p in setup.student.parameters()]
    out = tmp_path / "run.jsonl"
    run_arm(setup, arm, 1e-4, 0, steps=1, problems=1, group=2, eval_every=1, eval_samples=1, wall_s=1e9, out=out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(e["kind"], e["step"]) for e in lines] == [("eval", 0), ("step", 1), ("eval", 1)]
    assert lines[1]["sampler_mismatch"] < 1e-4 and lines[1]["tokens"] > 0
    changed = any(not torch.equal(a, b) for a, b in zip(before, setup.student.parameters()))
    # GRPO takes no step when both rollouts scored the same (their advantages are 0).
    assert changed or (arm == "grpo" and lines[1]["grad_norm"] == 0.0)


def _evaluation(step: int, correct: list[float], kl: list[float]) -> dict[str, Any]:
    return {"kind": "eval", "arm": "opd", "lr": 1e-4, "seed": 0, "step": step, "rollouts": 64 * step, "sampled_accuracy": sum(correct) / 16,
            "greedy_accuracy": 0.5, "item_correct": correct, "item_kl_exact": kl, "item_tokens": [10.0, 10.0]}


def test_the_report_reads_gap_closed_and_the_kl_change_from_the_evaluations(tmp_path: Path) -> None:
    # Two items, 8 samples each: the student goes from 1 + 1 to 5 + 3 correct, the teacher has 8 + 8.
    lines = [_evaluation(0, [1.0, 1.0], [6.0, 8.0]), _evaluation(50, [5.0, 3.0], [3.0, 4.0])]
    (tmp_path / "opd.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    (tmp_path / "opd.teacher.json").write_text(json.dumps({"item_correct": [8.0, 8.0], "sampled_accuracy": 1.0, "greedy_accuracy": 1.0}))
    runs, teacher = report.load_runs(tmp_path)
    (row,) = report.summarise(runs, teacher)
    assert row["gap_closed"] == pytest.approx(6 / 14)
    assert (row["kl_start"], row["kl_end"]) == pytest.approx((0.7, 0.35))
    low, high = row["kl_change_95"]
    assert low <= -0.35 <= high < 0
    assert "+0.429" in report.markdown([row], teacher)
    assert row["gap_curve"] == [(0, 0.0), (50, pytest.approx(6 / 14))]
    assert row["steps_to_0.1"] == pytest.approx(50 * 0.1 / (6 / 14)) and report.steps_to(row["gap_curve"], 0.5) is None
    assert report.steps_to([(0, 0.0), (20, 0.05), (40, 0.15), (60, 0.12)], 0.1) == pytest.approx(30.0)


def test_the_sweep_gives_every_run_its_arm_and_the_shared_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[list[str]] = []

    class Finished:
        def __init__(self, argv: list[str], **_: Any) -> None:
            started.append(argv)

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(sweep.subprocess, "Popen", Finished)
    with pytest.raises(SystemExit) as ended:
        sweep.main(["--bundle", "b.json", "--out", str(tmp_path), "--wall-s", "60", "--runs", "opd:1e-4:0", "grpo:3e-4:1", "--", "--steps", "5"])
    assert ended.value.code == 0
    first, second = (argv[argv.index("-m") + 1:] for argv in started)
    assert first[:9] == ["experiments.opd_plain.loop", "--bundle", "b.json", "--arm", "opd", "--lr", "1e-4", "--seed", "0"]
    assert "--eval-teacher" in first and "--eval-teacher" not in second  # the ceiling, once
    assert second[4:9] == ["grpo", "--lr", "3e-4", "--seed", "1"] and second[-2:] == first[-2:] == ["--steps", "5"]
    assert second[second.index("--out") + 1] == str(tmp_path / "grpo_lr3e-4_s1.jsonl")


def test_printing_numbers_pays_for_their_text() -> None:
    """Each printed number pays for its text, not one step: two million 101-digit numbers were
    ~400 MB of output before the cut, two million floats' text ~6 s."""
    result = run_python("print([[-10**100]*1000]*1990)")
    assert result["exit_code"] == 1 and result["stderr"] == f"Unsupported: the program takes more than {tools.MAX_STEPS} steps"
    assert run_python("print([[-2.2250738585072014e-308 ** 0.9] * 1000] * 1990)")["stderr"] == result["stderr"]
    assert run_python("print([1.5]*1000)")["stdout"] == str([1.5] * 1000)[: tools.MAX_OUTPUT_CHARS] + "\n...[truncated at 2000 characters]"


def test_an_unknown_tools_name_is_echoed_cut() -> None:
    """The model's tool name is echoed in the error, its first 100 characters only."""
    error = answer_call(json.dumps({"name": "x" * 1_000_000, "arguments": {}}))["error"]
    assert error == f"no tool {'x' * 100!r} with these arguments"
