"""Every command the README shows works as written, so the README cannot drift from the code.

The commands are read out of README.md and every page in docs/ (their indented code
blocks, and inline commands that start with `python -m`, `mlflow` or `scripts/`); each must have a
check in `CHECKS` below and each check a command in one of them. What a check does depends on what this machine allows:
- `run`: run as a user would (`python -m ...` from the project root), placeholders such as
  `outputs/runs/...` filled in, everything written under a temporary `output_root`, against the
  scripted OpenAI/vLLM-compatible server (`server=vllm`, opd/serving/scripted_server.py) with small
  overrides where the command is long (fewer steps);
- `fails`: a command for machines this one cannot reach (`gpu-host`): it fails within seconds,
  with one line naming the key;
- `compose`: a command for resources this machine lacks (a GPU, a hub model, a Ray cluster, 17
  minutes): its overrides compose and validate as a launch would (every job's, for a sweep);
- `help`, `syntax`: a tool's options exist (`--help`), a script parses (`bash -n`);
- `mention`: not a command to run (a module named in the prose, a fragment with `...`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from conftest import ROOT, compose
from helpers import mlflow_serving
from opd.config import validate

README = ROOT / "README.md"
# The README and every page in docs/ (the README must link each one).
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

# command as the README writes it -> (check, why or what it needs)
CHECKS: dict[str, tuple[str, str]] = {
    "scripts/install.sh && .venv/bin/python -m experiments.launch env=opd_coding distill_topk=20":
        ("run", "the main command; with its own vLLM in test_launch_vllm.py::test_readme_command_runs_with_the_embedded_server"),
    "scripts/install.sh && .venv/bin/python -m pytest": ("pytest", "the suite collects (running it here would run it twice)"),
    "scripts/install.sh": ("syntax", "installing is what made this venv"),
    "python -m experiments.launch env=inline_math total_steps=3 group_size=8 seed=1": ("run", "what a run gives you"),
    "python -m opd.records view outputs/runs/.../groups.jsonl [--tokenizer DIR] [--out page.html]": ("run", "on a run's groups"),
    "python -m opd.records check outputs/runs/.../groups.jsonl": ("run", "on a run's groups"),
    "python -m opd.records check --rerender outputs/runs/.../groups.jsonl": ("run", "on a run's groups, with its model's chat template"),
    "python -m opd.records export outputs/runs/.../ --format parquet --out outputs/dataset": ("run", "on a run's directory; `datasets` loads it"),
    "mlflow ui --backend-store-uri sqlite:///outputs/mlflow.db": ("run", "serves the store the runs wrote"),
    "python -m opd.tracking.session": ("mention", "the tracking process the run starts itself"),
    "python -m experiments.launch experiment=closed_loop_inline_math": ("compose", "17 minutes of CPU training"),
    "python -m experiments.launch env=inline_math teacher=model teacher.server.model=fixture_teacher":
        ("compose", "two vLLM servers; run by tests/test_teacher.py with a stand-in teacher and the closed loop"),
    "python -m experiments.bench teacher": ("help", "starts the embedded vLLM: minutes"),
    "python -m experiments.launch -m experiment=reward_sweep_closed_loop && python -m experiments.compare outputs/sweeps/<date>/<time>":
        ("compose", "two closed loops; compare is run on the reward sweep below"),
    "python -m experiments.launch -m experiment=opd_vs_grpo":
        ("compose", "three closed loops (49 min of CPU); tests/test_opd_vs_grpo.py runs it at a tiny budget on vLLM"),
    "python -m experiments.launch -m experiment=opd_vs_grpo arm=opd,opd_topk sweep.seeds=1":
        ("compose", "two closed loops (half an hour of CPU); tests/test_opd_vs_grpo.py runs the experiment at a tiny budget on vLLM"),
    "python -m opd.fixture.build --config opd/fixture/student/build_config.json": ("help", "rebuilding the student takes 44 minutes"),
    "python -m experiments.opd_plain.bundle --out bundle.json": ("help", "tests/test_opd_plain.py makes the bundle and runs each arm a step"),
    "python -m experiments.opd_plain.sweep --bundle bundle.json --out results --wall-s 420 --runs grpo:1e-4:0 grpo:1e-4:1 opd:1e-4:0 opd:1e-4:1 "
    "opd_full:1e-4:0 opd_full:1e-4:1 mix:1e-4:0 mix:1e-4:1 -- --steps 400 --eval-every 20":
        ("help", "7 minutes of a GPU; tests/test_opd_plain.py checks the runs it starts"),
    "python -m experiments.opd_plain.sweep --bundle bundle.json --out results --wall-s 235 --runs opd_full:3e-4:0 opd:1e-4:0 grpo:1e-4:0 "
    "-- --steps 100 --eval-every 25": ("help", "4 minutes of a GPU; as above"),
    "python -m experiments.opd_plain.report results": ("help", "tests/test_opd_plain.py reports on evaluations it wrote"),
    "python -m experiments.launch -m experiment=opd_vs_grpo && python -m experiments.compare outputs/sweeps/<date>/<time>":
        ("compose", "three closed loops (49 min of CPU); tests/test_opd_vs_grpo.py runs it at a tiny budget on vLLM"),
    "python -m experiments.bench loop": ("help", "a closed-loop iteration: minutes"),
    "python -m experiments.launch dataset=math_local dataset.path=/data/problems.jsonl dataset.prompt_field=question": ("run", "on a file of questions"),
    "python -m experiments.launch reward.weights.tool_use=0.5 env.max_tool_calls=5": ("run", ""),
    "python -m experiments.launch model=qwen3 server=vllm server.model=Qwen/Qwen3-4B server.base_urls=[http://gpu-host:8000/v1]": ("fails", "server.model"),
    "python -m experiments.launch model=qwen3 server.model=Qwen/Qwen3-4B": ("compose", "a GPU and the hub"),
    "python -m experiments.launch --cfg job --resolve": ("run", "prints every value"),
    "OPD_INFERENCE=gpu scripts/install.sh": ("syntax", "the CUDA build needs a GPU machine"),
    "python -m experiments.launch model=qwen3 server.model=/path/or/hub-name env=opd_coding": ("compose", "a GPU and a real model"),
    "python -m experiments.launch model=qwen3 server=vllm server.model=Qwen/Qwen3-4B server.base_urls=[http://a:8000/v1,http://b:8000/v1]": ("fails", "server.model"),
    "python -m vllm.entrypoints.openai.api_server": ("mention", "what server=local starts"),
    "python -m opd.fixture.build": ("help", "training the fixture takes 8 minutes"),
    "python -m opd.fixture.build --preset teacher": ("help", "training the fixture's teacher takes 30 minutes"),
    "python -m opd.train.untied <model> <dir>": ("help", "tests/test_closed_loop.py serves such a copy and refreshes it"),
    "python -m experiments.launch -m env=opd_coding reward.weights.correctness=0.5,0.7,0.9 reward.weights.efficiency=0.1,0.2": ("run", "the 6-job sweep"),
    "python -m experiments.compare outputs/sweeps/<date>/<time>": ("run", "on that sweep"),
    "python -m experiments.compare <sweep dir>": ("mention", "the command above, in the timings table"),
    "python -m experiments.launch -m hydra/launcher=slurm hydra.launcher.partition=gpu ...": ("mention", "a fragment; tests/test_slurm.py runs Slurm sweeps"),
    "python -m opd.atropos.inline_math serve --openai.base_url http://gpu-host:8000/v1 --openai.model_name Qwen/Qwen3-4B --env.tokenizer_name Qwen/Qwen3-4B --env.opd_overrides '[\"model=qwen3\"]'":
        ("run", "until it waits for a trainer"),
    "python -m opd.atropos.opd_coding process --env.total_steps 20 --env.data_path_to_save_groups data/opd_coding.jsonl --openai.base_url ... --env.use_wandb false":
        ("run", "2 steps"),
    "python -m opd.atropos.inline_math ...": ("mention", "a fragment of the command above"),
    "python -m experiments.launch env=opd_coding runner.workers=2": ("compose", "a Ray cluster: 75 s to start here (tests/test_distributed.py)"),
    "RAY_ADDRESS=head:6379 RAY_AUTH_MODE=token python -m experiments.launch env=opd_coding runner.workers=16 model=qwen3 server=vllm "
    "server.model=Qwen/Qwen3-4B server.base_urls=[http://gpu-a:8000/v1,http://gpu-b:8000/v1]":
        ("compose", "a Ray cluster and GPU servers"),
    "python -m experiments.bench overhead|opd|records|startup|e2e|tools|viewer|teacher|all [--repeats 3] [--embedded] [--set KEY=VALUE] [--root DIR] [--url URL]":
        ("help", "benchmarks take minutes each"),
    "python -m experiments.bench compare --root DIR [--latency S] [--in-flight N] [--workers N,M] [--repeats 3]":
        ("help", "two checkouts' overhead benches side by side: minutes"),
    "python -m experiments.bench.same_records --rev REV [--env NAME] [--groups 4] [--seed 0] [--set KEY=VALUE]":
        ("help", "two checkouts' runs: a minute; tests/test_same_records.py runs it on this tree and a changed copy"),
    ".venv/bin/python -m pytest": ("pytest", "the suite collects"),
    ".venv/bin/python -m pytest -m fast": ("pytest", "the tier collects, no heavy test in it"),
    ".venv/bin/python -m pytest -m vllm": ("pytest", "the tier collects"),
    ".venv/bin/python -m pytest -m \"ray or slurm or browser\"": ("pytest", "the tiers collect"),
    ".venv/bin/python -m pytest -m slow": ("pytest", "the tier collects"),
    ".venv/bin/python -m opd.fixture.build --out /tmp/fixture": ("help", "training the fixture takes 8 minutes"),
    ".venv/bin/python -m opd.fixture.build --preset teacher --out /tmp/teacher": ("help", "training the fixture's teacher takes 30 minutes"),
    ".venv/bin/python -m opd.fixture.probe /tmp/teacher": ("help", "a teacher built there; tests/test_fixture.py probes the fixture"),
    "python -m opd.fixture.probe [MODEL_DIR ...]": ("help", "as above"),
    "scripts/lock.sh [cpu] [gpu]": ("syntax", "resolving the locks takes minutes and the registries"),
    "scripts/lock.sh": ("syntax", "as above"),
    "python -m experiments.screenshots --run RUN_ID --sweep SWEEP_DIR": ("help", "serves MLflow's UI and drives Chromium: a minute"),
    "python -m opd.records": ("mention", "the module of view and check"),
    "python -m opd.records check": ("mention", "the command above, named in the guarantees table"),
    "python -m opd.fixture.families model qwen3 --out /tmp/tiny-qwen3":
        ("mention", "built for every family and run by tests/test_real_models_vllm.py (slow: a vLLM server per family)"),
    "python -m experiments.launch model=qwen3 server.model=/tmp/tiny-qwen3 env=opd_coding total_steps=2 group_size=2 env.max_tokens_per_turn=192":
        ("mention", "run as written but for its server by tests/test_real_models_vllm.py (the other presets with cut budgets)"),
}

_INLINE = re.compile(r"`((?:python -m|\.venv/bin/python|mlflow ui|scripts/)[^`]*)`")


def readme_commands() -> list[str]:
    """Every command in README.md and docs/*.md, in order, without its `# comment`: the lines of
    their indented code blocks (a trailing backslash joins the next line) and inline commands."""
    found: list[str] = []
    lines = [line for page in PAGES for line in [*page.read_text().splitlines(), ""]]
    in_fence = False
    pending = ""
    for line in lines:
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        code = re.match(r"^ {4,}(\S.*)$", line)
        if code and (pending or re.match(r"\.venv/bin/python\b|python\b|scripts/|[A-Z_]+=\S+ |mlflow\b", code.group(1))):
            text = pending + code.group(1)
            if text.rstrip().endswith("\\"):
                pending = text.rstrip()[:-1].rstrip() + " "
                continue
            pending = ""
            found.append(re.sub(r"\s+#.*$", "", text).strip())
            continue
        for match in _INLINE.finditer(line):
            found.append(match.group(1).strip())
    return list(dict.fromkeys(found))


def test_every_readme_command_has_a_check_and_every_check_a_command() -> None:
    commands = readme_commands()
    unchecked = [c for c in commands if c not in CHECKS]
    stale = [c for c in CHECKS if c not in commands]
    assert not unchecked, "README commands without a check in tests/test_readme.py:\n" + "\n".join(unchecked)
    assert not stale, "checks of commands no longer in the README:\n" + "\n".join(stale)


def test_the_readme_is_a_front_page_with_the_two_commands_first() -> None:
    """A page a newcomer reads in minutes (the rest is in docs/), opening with the two commands for
    a fresh machine, the second of them the one `.ci/run` runs."""
    assert len(README.read_text().splitlines()) <= 300
    first, second = readme_commands()[:2]
    assert first.startswith("scripts/install.sh && .venv/bin/python -m experiments.launch ")
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [second] == ["scripts/install.sh && .venv/bin/python -m pytest"]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_links_every_page_in_docs_and_every_link_lands() -> None:
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)\)", README.read_text()))
    assert linked == {f"docs/{p.name}" for p in PAGES[1:]}, "docs/ pages and the README's links to them differ"
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, fragment = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.is_file(), f"{page.name}: link to {target}: no such file"
            if fragment and file.suffix == ".md":
                anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", file.read_text(), re.M)}
                assert fragment in anchors, f"{page.name}: link to {target}: no such heading"


# ---- compose: every job's overrides compose and validate ------------------------------------


def launch_overrides(command: str) -> tuple[list[str], bool]:
    """(the overrides, whether it is a sweep) of the first `python -m experiments.launch` in `command`."""
    part = next(p for p in command.split("&&") if "experiments.launch" in p)
    words = shlex.split(part)
    words = words[words.index("experiments.launch") + 1:]
    sweep = "-m" in words
    return [w for w in words if not w.startswith("-")], sweep


def jobs_of(overrides: list[str], sweep: bool) -> list[list[str]]:
    if not sweep:
        return [overrides]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (batch,) = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(overrides), None)
    return batch


@pytest.mark.parametrize("command", [c for c, (kind, _) in CHECKS.items() if kind == "compose"], ids=lambda c: c.split("launch ", 1)[-1][:50])
def test_commands_for_other_machines_compose_and_validate(command: str) -> None:
    overrides, sweep = launch_overrides(command)
    for job in jobs_of(overrides, sweep):
        validate(compose(job))


# ---- help, syntax, pytest: the options exist ------------------------------------------------------


def _python(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kwargs)


def test_tools_too_long_to_run_here_accept_what_the_readme_passes() -> None:
    bench = _python("-m", "experiments.bench", "--help")
    assert bench.returncode == 0, bench.stderr
    for name in ("overhead", "opd", "records", "startup", "e2e", "tools", "viewer", "loop", "all"):
        assert name in bench.stdout
    for flag in ("--repeats", "--embedded", "--set", "--root"):
        assert flag in bench.stdout
    same = _python("-m", "experiments.bench.same_records", "--help")
    assert same.returncode == 0, same.stderr
    for flag in ("--rev", "--root", "--env", "--groups", "--seed", "--set"):
        assert flag in same.stdout
    probe = _python("-m", "opd.fixture.probe", "--help")
    assert probe.returncode == 0 and "--transcripts" in probe.stdout and "MODEL_DIR" in probe.stdout, probe.stderr[-2000:]
    for module, flags in (("bundle", ("--out",)), ("sweep", ("--bundle", "--out", "--wall-s", "--runs")), ("report", ("results",)),
                          ("loop", ("--steps", "--eval-every", "--arm"))):
        plain = _python("-m", f"experiments.opd_plain.{module}", "--help")
        assert plain.returncode == 0 and all(flag in plain.stdout for flag in flags), plain.stderr[-2000:]
    fixture = _python("-m", "opd.fixture.build", "--help")
    assert fixture.returncode == 0 and "--out" in fixture.stdout
    for flag in ("--preset", "teacher", "--config"):
        assert flag in fixture.stdout
    for script, env in (("scripts/install.sh", {}), ("scripts/lock.sh", {})):
        assert subprocess.run(["bash", "-n", script], cwd=ROOT, env={**os.environ, **env}).returncode == 0
    assert (ROOT / "locks" / "gpu.txt").exists() and "OPD_INFERENCE" in (ROOT / "scripts/install.sh").read_text()


def _markers(tmp_path: Path) -> dict[str, set[str]]:
    """{test id: its marker names} of the whole suite, as `pytest --collect-only` collects it
    (failing the test if it cannot collect)."""
    dump = tmp_path / "markers.json"
    env = {**os.environ, "OPD_MARKERS_OUT": str(dump), "PYTHONPATH": str(ROOT / "tests")}
    out = _python("-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "collected_markers", timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {test: set(names) for test, names in json.loads(dump.read_text()).items()}


def _selected(args: tuple[str, ...], markers: dict[str, set[str]]) -> set[str]:
    """The tests `pytest ARGS` runs: all of them, or those whose markers match `-m EXPR` (pytest's
    own expression)."""
    from _pytest.mark.expression import Expression

    if not args:
        return set(markers)
    assert len(args) == 2 and args[0] == "-m", f"a README test command with arguments other than -m EXPR: {args}"
    expression = Expression.compile(args[1])
    return {test for test, names in markers.items() if expression.evaluate(lambda name, **_: name in names)}


@pytest.mark.slow
def test_the_test_commands_collect_the_suite_and_the_fast_tier_holds_no_heavy_test(tmp_path: Path) -> None:
    commands = sorted({tuple(shlex.split(c.split("-m pytest", 1)[1])) for c, (kind, _) in CHECKS.items() if kind == "pytest"})
    markers = _markers(tmp_path)
    tiers = {args: _selected(args, markers) for args in commands}
    assert all(tiers.values()), [args for args, tests in tiers.items() if not tests]
    everything, fast = tiers[()], tiers[("-m", "fast")]
    heavy = tiers[("-m", "vllm")] | tiers[("-m", "ray or slurm or browser")] | tiers[("-m", "slow")]
    # Every test is in the fast tier or a heavy one, never both.
    assert fast | heavy == everything and not fast & heavy, sorted(fast & heavy)[:10]


# ---- fails: a command for another machine says so in one line, at once ----------------------------


@pytest.mark.parametrize("command", [c for c, (kind, _) in CHECKS.items() if kind == "fails"], ids=lambda c: c.split("launch ", 1)[-1][:50])
def test_commands_for_unreachable_machines_fail_at_once_in_one_line(command: str, tmp_path: Path) -> None:
    """Here the hub is unreachable too, so the model is what fails first (it is looked up before any
    server is asked); test_config's table covers servers that never answer."""
    overrides, _ = launch_overrides(command)
    started = time.monotonic()
    out = _python("-m", "experiments.launch", *overrides, f"output_root={tmp_path}", timeout=120)
    said = [line for line in (out.stdout + out.stderr).splitlines() if "error" in line.lower()]
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert len(said) == 1 and CHECKS[command][1] in said[0], said
    assert "Traceback" not in out.stderr and time.monotonic() - started < 60


def test_the_atropos_serve_line_as_written_fails_at_once_in_one_line_here(tmp_path: Path) -> None:
    """Here neither the hub nor gpu-host is reachable: the README's `serve` line stops within
    seconds with one line naming `--env.tokenizer_name` (atroposlib's tokenizer load would retry
    the hub for two minutes, then print a 60-line traceback), or `--openai.base_url` where the
    hub answers."""
    serve = next(c for c in CHECKS if c.startswith("python -m opd.atropos.inline_math serve"))
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"} | {"PYTHONPATH": str(ROOT)}  # as a user has it: the suite sets it
    started = time.monotonic()
    out = subprocess.run([sys.executable, *shlex.split(serve)[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-3000:]
    (line,) = out.stderr.splitlines()
    assert re.match(r"error: --env\.tokenizer_name='Qwen/Qwen3-4B': |error: --openai\.base_url: nothing answers at http://gpu-host", line), line
    assert time.monotonic() - started < 30


# ---- run: as a user runs them ----------------------------------------------------------------------


def _scripted_overrides(url: str) -> list[str]:
    return ["server=vllm", f"server.model={ROOT / 'opd' / 'fixture' / 'model'}", f"server.base_urls=[{url}]"]


def _launch(command: str, root: Path, extra: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    overrides, sweep = launch_overrides(command)
    args = ["-m", "experiments.launch", *(["-m"] if sweep else []), *overrides, f"output_root={root}", *extra]
    out = _python(*args, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, f"{command}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _only(pattern: str, root: Path) -> Path:
    (found,) = sorted(root.glob(pattern))
    return found


@pytest.fixture(scope="module")
def scripted() -> Iterator[str]:
    from experiments.bench import scripted_server

    with scripted_server(0.01) as url:
        yield url


def test_print_the_config_shows_every_value_resolved() -> None:
    out = _python("-m", "experiments.launch", "--cfg", "job", "--resolve")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "${" not in out.stdout and re.search(r"^output_dir: /\S+_inline_math$", out.stdout, re.M), out.stdout[-500:]
    assert "uri: sqlite:///outputs/mlflow.db" in out.stdout


@pytest.mark.slow
def test_a_run_then_its_viewer_check_and_mlflow_ui(tmp_path: Path, scripted: str) -> None:
    command = "python -m experiments.launch env=inline_math total_steps=3 group_size=8 seed=1"
    out = _launch(command, tmp_path, _scripted_overrides(scripted))
    run_dir = _only("runs/*/*_inline_math", tmp_path)
    assert {"groups.jsonl", "groups.html", "config.yaml", "launch.log", "summary.json"} <= {p.name for p in run_dir.iterdir()}
    assert "finished:" in out.stdout and str(run_dir / "groups.jsonl") in out.stdout
    groups = str(run_dir / "groups.jsonl")
    view = _python("-m", "opd.records", "view", groups, "--out", str(tmp_path / "page.html"))
    assert view.returncode == 0 and (tmp_path / "page.html").stat().st_size > 0, view.stderr
    check = _python("-m", "opd.records", "check", groups)
    assert check.returncode == 0, check.stdout + check.stderr
    rerendered = _python("-m", "opd.records", "check", "--rerender", groups)
    assert rerendered.returncode == 0 and "0 differences from it" in rerendered.stdout + rerendered.stderr, rerendered.stdout + rerendered.stderr
    exported = _python("-m", "opd.records", "export", str(run_dir), "--format", "parquet", "--out", str(tmp_path / "dataset"))
    assert exported.returncode == 0, exported.stdout + exported.stderr
    import datasets

    rows = datasets.load_dataset("parquet", data_dir=str(tmp_path / "dataset"), split="train")
    assert len(rows) == 3 * 8 and rows.features["completion_ids"].feature.dtype == "int32"
    run = _mlflow_ui_serves(f"sqlite:///{tmp_path}/mlflow.db", expect_run="inline_math fixture total_steps=3 group_size=8 seed=1", workdir=tmp_path)
    # Where the run was, group by group: in its log and on the MLflow run (not only the console's bar).
    log = (run_dir / "launch.log").read_text()
    assert all(f"groups: {n} of 3 written" in log for n in (1, 2, 3)), log[-3000:]
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert tags["opd.progress"].startswith("groups: 3 of 3 written (0 failed, 0 dropped")


def _mlflow_ui_serves(uri: str, expect_run: str, workdir: Path) -> dict:
    """`mlflow ui --backend-store-uri URI` (on a free port) answers and lists the run; the run."""
    import urllib.request

    with mlflow_serving(["ui", "--backend-store-uri", uri], workdir) as url:
        request = urllib.request.Request(f"{url}/api/2.0/mlflow/runs/search", data=b'{"experiment_ids": ["1"]}',
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            runs = json.load(response)["runs"]
    named = [r for r in runs if r["info"]["run_name"] == expect_run]
    assert named, [r["info"]["run_name"] for r in runs]
    return named[0]


@pytest.mark.slow
@pytest.mark.parametrize("command", [
    "python -m experiments.launch reward.weights.tool_use=0.5 env.max_tool_calls=5",
    "python -m experiments.launch dataset=math_local dataset.path=/data/problems.jsonl dataset.prompt_field=question",
    "scripts/install.sh && .venv/bin/python -m experiments.launch env=opd_coding distill_topk=20",
])
def test_launch_commands_run_as_written(command: str, tmp_path: Path, scripted: str) -> None:
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(30)))
    command = command.replace("/data/problems.jsonl", str(problems))
    _launch(command, tmp_path, [*_scripted_overrides(scripted), "total_steps=2", "group_size=2"])
    summary = json.loads(_only("runs/*/*/summary.json", tmp_path).read_text())
    assert summary["summary/groups_written"] == 2


@pytest.mark.slow
def test_the_sweep_and_compare_run_as_written(tmp_path: Path, scripted: str) -> None:
    command = "python -m experiments.launch -m env=opd_coding reward.weights.correctness=0.5,0.7,0.9 reward.weights.efficiency=0.1,0.2"
    out = _launch(command, tmp_path, [*_scripted_overrides(scripted), "total_steps=1", "group_size=2"], timeout=1200)
    sweep_dir = _only("sweeps/*/*", tmp_path)
    assert len(list(sweep_dir.glob("*/summary.json"))) == 6
    assert "sweep job 6 of 6" in out.stdout
    compare = _python("-m", "experiments.compare", str(sweep_dir))
    assert compare.returncode == 0, compare.stderr[-2000:]
    assert "correctness=0.9,efficiency=0.2" in compare.stdout and (sweep_dir / "compare.csv").exists()


@pytest.mark.slow
def test_atroposlib_commands_run_as_written(tmp_path: Path, scripted: str) -> None:
    fixture = str(ROOT / "opd" / "fixture" / "model")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    process = next(c for c in CHECKS if " process " in c)
    words = shlex.split(process.replace("--openai.base_url ...", f"--openai.base_url {scripted}").replace("--env.total_steps 20", "--env.total_steps 2")
                        .replace("data/opd_coding.jsonl", str(tmp_path / "opd_coding.jsonl")))
    out = subprocess.run([sys.executable, *words[1:], "--openai.model_name", fixture, "--env.group_size", "2"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len((tmp_path / "opd_coding.jsonl").read_text().splitlines()) == 2
    # `serve` as written (its hosts and model on this machine): it takes our overrides, builds the
    # environment and goes on to register with the trainer API, which is not here.
    serve = next(c for c in CHECKS if " serve " in c)
    words = shlex.split(serve.replace("http://gpu-host:8000/v1", scripted).replace("Qwen/Qwen3-4B", fixture))
    out = subprocess.run([sys.executable, *words[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    said = out.stdout + out.stderr
    assert "opd_overrides=['model=qwen3']" in said and "validation error" not in said, said[-3000:]
    assert "register_env" in said and "ClientConnectorError" in said, said[-3000:]  # as far as the trainer API, not here
