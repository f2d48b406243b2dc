"""The composed config tree: groups, interpolated knobs, schema errors, range checks."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import MISSING, open_dict, read_write
from omegaconf.errors import ConfigKeyError, ValidationError

from conftest import CONF, compose, one_fast
from opd.config import ConfigError, EnvConfig, InlineMathEnvConfig, InlineMathRewardConfig, SandboxConfig, validate
from opd.envs.registry import EnvSpec


def test_default_composes_to_typed_config() -> None:
    cfg = validate(compose())
    assert isinstance(cfg.env, InlineMathEnvConfig)
    assert isinstance(cfg.reward, InlineMathRewardConfig)
    assert cfg.dataset.name == "math_builtin"
    assert cfg.server.kind == "local" and cfg.server.model == "fixture"
    assert cfg.tracking.uri == "sqlite:///outputs/mlflow.db"
    assert cfg.tracking.experiment == "inline_math"


def test_top_level_knobs_reach_groups() -> None:
    cfg = validate(compose(["env=inline_math", "group_size=8", "total_steps=3", "seed=1", "distill_topk=32", "judge_votes=5"]))
    assert (cfg.group_size, cfg.total_steps, cfg.seed) == (8, 3, 1) and not hasattr(cfg.env, "group_size")  # one home
    assert cfg.server.max_logprobs == 32  # the local server is started with --max-logprobs >= K
    assert cfg.judge.votes == 5


def test_env_selects_dataset_and_reward_but_they_still_override() -> None:
    cfg = validate(compose(["dataset=math_local", "dataset.path=/data/p.jsonl", "reward.weights.tool_use=0.5"]))
    assert cfg.dataset.source == "local" and cfg.dataset.path == "/data/p.jsonl"
    assert cfg.reward.weights.tool_use == 0.5
    assert validate(compose(["dataset=acereason_math"])).dataset.numeric_answers_only is True


def test_opd_coding_selects_its_dataset_reward_and_reads_the_knobs() -> None:
    from opd.config import OPDCodingEnvConfig, OPDCodingRewardConfig

    cfg = validate(compose(["env=opd_coding", "distill_topk=20", "judge_votes=5", "reward.weights.correctness=0.5"]))
    assert isinstance(cfg.env, OPDCodingEnvConfig) and isinstance(cfg.reward, OPDCodingRewardConfig)
    assert cfg.dataset.name == "coding_builtin" and cfg.tracking.experiment == "opd_coding"
    assert cfg.env.opd.topk == 20 and cfg.server.max_logprobs == 20 and cfg.judge.votes == 5
    assert cfg.reward.weights.correctness == 0.5 and cfg.reward.efficiency.steps == [[0.5, 0.8], [0.75, 0.5]]
    assert validate(compose(["env=opd_coding", "dataset=humaneval"])).dataset.source == "humaneval"
    judge = validate(compose(["env=opd_coding", "judge=server", "judge.base_url=http://127.0.0.1:9/v1", "judge.model=j"])).judge
    assert judge.kind == "server" and judge.votes == 3


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("group_size=abc", "full_key: group_size"),
        ("env.max_tool_calls=many", "full_key: env.max_tool_calls"),
        ("reward.weights.correct=high", "full_key: reward.weights.correct"),
        ("env.no_such_key=1", "env.no_such_key"),
        ("runner.groups_in_flight=x", "full_key: runner.groups_in_flight"),
    ],
)
def test_wrong_types_and_unknown_keys_fail_at_composition(override: str, message: str) -> None:
    with pytest.raises(ConfigCompositionException) as info:
        compose([override])
    text = str(info.value) + str(info.value.__cause__)
    assert message in text
    assert isinstance(info.value.__cause__, (ValidationError, ConfigKeyError)) or "Could not override" in text


@pytest.mark.parametrize("overrides", [["env=opd_coding"], ["env=inline_math", "model=gpt_oss"], ["experiment=opd_vs_grpo"],
                                       ["env=opd_coding", "model=mistral", "teacher=model", "teacher.server.model=x"]])
def test_the_keys_validate_knows_are_the_typed_configs_own(overrides: list[str]) -> None:
    """validate's known keys, read off the typed config, are those OmegaConf's structured copy of
    it has (what validate built before, at two thirds of its time)."""
    from omegaconf import OmegaConf

    from opd.config.load import _leaf_keys

    def paths(tree: object, prefix: str) -> list[str]:  # OmegaConf's container, walked here
        if not isinstance(tree, dict) or not tree:
            return [prefix]
        return [path for key, value in tree.items() for path in paths(value, f"{prefix}.{key}" if prefix else key)]

    typed = validate(compose(overrides))
    assert sorted(_leaf_keys(typed)) == sorted(paths(OmegaConf.to_container(OmegaConf.structured(typed), resolve=False), ""))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["group_size=0"], "group_size must be >= 1"),
        (["total_steps=0"], "total_steps must be >= 1"),
        (["distill_topk=0", "server.max_logprobs=1"], "distill_topk must be >= 1"),
        (["judge_votes=0"], "judge_votes must be >= 1, got 0 (it sets judge.votes)"),
        (["env=opd_coding", "distill_topk=0", "server=vllm", "server.model=m", "server.base_urls=[http://a/v1]"], "distill_topk must be >= 1, got 0 (it sets env.opd.topk)"),
        (["env=opd_coding", "env.opd.topk=0", "server=vllm", "server.model=m", "server.base_urls=[http://a/v1]"], "env.opd.topk must be >= 1"),
        (["server.max_attempts=0"], "server.max_attempts must be >= 1"),
        (["server.keepalive_s=0"], "server.keepalive_s must be >= 0.1"),
        (["+server.environment.VLLM_HTTP_TIMEOUT_KEEP_ALIVE=2"],
         "server.environment.VLLM_HTTP_TIMEOUT_KEEP_ALIVE must be whole seconds above server.keepalive_s=3 (the client must close an idle connection first), got '2'"),
        (["env=opd_coding", "judge=server", "judge.base_url=http://x/v1", "judge.model=m", "judge.keepalive_s=0"], "judge.keepalive_s must be >= 0.1"),
        (["env.sandbox.max_open_files=2"], "env.sandbox.max_open_files must be >= 8"),
        (["env=opd_coding", "reward.tool_usage.other=2"], "reward.tool_usage.other must be in [0, 1]"),
        (["env=opd_coding", "judge=server", "judge.base_url=ftp://x", "judge.model=m"], "judge.base_url must be an http(s) URL"),
        (["reward.weights.tool_use=-0.1"], "reward.weights.tool_use must be >= 0"),
        (["reward.weights.correct=-2"], "reward.weights.correct must be > reward.weights.incorrect"),
        (["env.temperature=9"], "env.temperature must be in [0, 5]"),
        (["env.top_p=0"], "env.top_p must be in (0, 1] or null (not sent), got 0.0"),
        (["distill_topk=30", "server.max_logprobs=20"], "server.max_logprobs must be >= distill_topk (30), got 20"),
        (["server=vllm", "server.model=m", "server.base_urls=[]"], "server.base_urls must be a non-empty list"),
        (["server=vllm", "server.model=m", "server.base_urls=[localhost:8000]"], "server.base_urls must be http(s) URLs"),
        (["dataset=math_local", "dataset.path=null"], "dataset.path must be set"),
        (["mode=serve_forever"], "mode must be one of"),
        (["runner.groups_in_flight=0"], "runner.groups_in_flight must be >= 1"),
        (["runner.oversubscribe=0.5"], "runner.oversubscribe must be >= 1, got 0.5"),
        (["env.sandbox.timeout_s=0"], "env.sandbox.timeout_s must be >= 1"),
        (["+env.no_such_key=1"], "unknown config key(s): env.no_such_key"),
        (["+reward.weights.speed=1"], "unknown config key(s): reward.weights.speed"),
        (["env=opd_coding", "env.max_turns=0"], "env.max_turns must be >= 1"),
        (["env=opd_coding", "env.opd.hint_placement=anywhere"], "env.opd.hint_placement must be one of"),
        (["env=opd_coding", "judge.decision_rule=vibes"], "judge.decision_rule must be one of"),
        (["env=opd_coding", "reward.weights.efficiency=-1"], "reward.weights.efficiency must be >= 0"),
        (["env=opd_coding", "reward.correctness_levels.crash=2"], "reward.correctness_levels.crash must be in [0, 1]"),
        (["env=opd_coding", "reward.efficiency.steps=[[2.0,1.0]]"], "reward.efficiency.steps must be"),
        (["mode=serve", "serve.rollout_server_url=localhost:8000"], "serve.rollout_server_url must be an http(s) URL"),
        (["serve.max_batches_offpolicy=0"], "serve.max_batches_offpolicy must be >= 1"),
        (["mode=sideways"], "mode must be one of"),
        (["tracking.traces_max_rollouts=-1"], "tracking.traces_max_rollouts must be >= 0"),
    ],
)
def test_ranges_fail_naming_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        validate(compose(overrides))
    assert message in str(info.value)


@dataclass
class TwoJailsEnvConfig(EnvConfig):
    """An environment of a user's that mounts the same sandbox schema at two paths."""

    sandbox: SandboxConfig = MISSING
    grader_sandbox: SandboxConfig = MISSING


TWO_JAILS = EnvSpec("two_jails", "test_config:nothing", lambda cfg: None, env_schema=TwoJailsEnvConfig)


def _with_two_jails(path: str, value: object) -> object:
    """The default config with env replaced by a TwoJailsEnvConfig env (as a user's env arrives:
    untyped, with its spec) whose `path` (under env) holds `value`."""
    from omegaconf import OmegaConf

    cfg = compose()
    env = OmegaConf.to_container(cfg.env, resolve=True)
    sampling = {k: env[k] for k in ("name", "temperature", "top_p", "top_k", "min_p", "eval_temperature")}
    tree = {**sampling, "spec": "test_config:TWO_JAILS", "sandbox": dict(env["sandbox"]), "grader_sandbox": dict(env["sandbox"])}
    node, key = tree, path.split(".")
    for part in key[:-1]:
        node = node[part]
    node[key[-1]] = value
    cfg.env = tree
    return cfg


@pytest.mark.parametrize(("path", "value", "message"), [
    ("sandbox.timeout_s", 0, "env.sandbox.timeout_s must be >= 1, got 0"),
    ("grader_sandbox.timeout_s", 0, "env.grader_sandbox.timeout_s must be >= 1, got 0"),
    ("grader_sandbox.max_open_files", 2, "env.grader_sandbox.max_open_files must be >= 8, got 2"),
    ("grader_sandbox.uid_base", 5, "env.grader_sandbox.uid_base must be in [1000, 2147423647], got 5"),
    # bwrap cannot map a uid at or above 2**31.
    ("grader_sandbox.uid_base", 2**31 - 60_000, "env.grader_sandbox.uid_base must be in [1000, 2147423647], got 2147423648"),
    ("grader_sandbox.backend", "unshare", "env.grader_sandbox.backend=unshare was removed"),
])
def test_a_schema_mounted_at_two_paths_is_named_at_the_path_of_the_bad_value(path: str, value: object, message: str) -> None:
    assert validate(_with_two_jails("grader_sandbox.timeout_s", 5)).env.grader_sandbox.timeout_s == 5  # the env is typed and checked
    with pytest.raises(ConfigError) as info:
        validate(_with_two_jails(path, value))
    assert message in str(info.value) and info.value.key == f"env.{path}"


def test_declared_ranges_name_null_and_the_walker_checks_every_element() -> None:
    from opd.config.checks import check_tree

    cfg = validate(compose(["trainer=local"]))
    cfg.trainer.loss["topk_kl"] = -1.0
    with pytest.raises(ConfigError, match=r"^trainer.loss.topk_kl must be >= 0, got -1.0$"):
        check_tree(cfg)
    with pytest.raises(ConfigError, match=r"^runner.groups_in_flight must be >= 1 or null \(from the servers' request slots\), got 0$"):
        validate(compose(["runner.groups_in_flight=0"]))
    with pytest.raises(ConfigError, match=r"^eval.seed must be in \[0, 2\*\*31\) or null \(unseeded\), got 2147483648$"):
        validate(compose(["eval.seed=2147483648"]))
    with pytest.raises(ConfigError, match=r"^server.base_urls must be http\(s\) URLs, got 'h:1'$"):
        validate(compose(["server=vllm", "server.model=m", "server.base_urls=[http://a/v1,h:1]"]))


def _keys_with_comments(path):
    """(line number, key path, the comment block above it) for every key of a YAML file (the
    entries of a defaults list excepted); sections count as keys."""
    lines = path.read_text().splitlines()
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    in_defaults = False
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped)
            continue
        if not stripped:
            comment = []
            continue
        indent = len(line) - len(line.lstrip())
        if line.startswith("defaults:"):
            in_defaults = True
            comment = []
            continue
        if in_defaults and stripped.startswith("- "):
            comment = []
            continue
        in_defaults = False
        key = stripped.split(":", 1)[0]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        yield number, ".".join(k for _, k in stack), tuple(comment)
        comment = []


def test_every_config_key_has_a_comment_above_it_sections_included() -> None:
    """House rule: a comment above every config field and section (defaults lists excepted)."""
    missing = [f"{path.relative_to(CONF)}:{number}: {key}" for path in sorted(CONF.rglob("*.yaml"))
               for number, key, comment in _keys_with_comments(path) if not comment]
    assert not missing, "keys without a comment above them:\n" + "\n".join(missing)


def test_each_comment_is_written_once() -> None:
    """The same key is not documented twice with the same words (shared parts are shared files)."""
    seen: dict[tuple[str, tuple[str, ...]], str] = {}
    repeated = []
    for path in sorted(CONF.rglob("*.yaml")):
        for number, key, comment in _keys_with_comments(path):
            where = f"{path.relative_to(CONF)}:{number}"
            if comment and (key, comment) in seen:
                repeated.append(f"{where} repeats {seen[key, comment]}: {key}")
            seen.setdefault((key, comment), where)
    assert not repeated, "\n".join(repeated)


def test_the_schema_has_no_defaults_the_yaml_is_the_one_source() -> None:
    import dataclasses

    from omegaconf import MISSING

    import importlib
    import pkgutil

    from opd import config

    modules = [importlib.import_module(f"opd.config.{m.name}") for m in pkgutil.iter_modules(config.__path__)]
    schemas = {cls for module in modules for cls in vars(module).values() if dataclasses.is_dataclass(cls) and isinstance(cls, type)
               and cls.__module__.startswith("opd.config.") and cls.__name__ != "Check"}
    assert len(schemas) >= 30 and {cls.__name__ for cls in schemas} <= set(config.__all__)  # every schema importable from opd.config
    with_defaults = [f"{cls.__name__}.{f.name}" for cls in schemas
                     for f in dataclasses.fields(cls) if f.default is not MISSING or f.default_factory is not dataclasses.MISSING]
    assert with_defaults == []


@pytest.mark.parametrize("preset", ["smoke", "reward_sweep_inline_math", "reward_sweep_opd_coding", "optuna_rewards", "closed_loop_inline_math",
                                    "closed_loop_opd_coding", "reward_sweep_closed_loop"])
def test_experiment_presets_compose_and_validate(preset: str) -> None:
    from opd.config import compose as compose_config

    cfg = compose_config([f"experiment={preset}"], hydra=True)
    params = cfg.hydra.sweeper.get("params") or {}
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    typed = validate(cfg)
    if preset == "smoke":
        assert (typed.total_steps, typed.group_size) == (2, 2)
    elif preset.startswith("closed_loop"):
        # A closed loop trains and evaluates after every trainer step; its objective is held-out accuracy.
        assert typed.trainer.kind == "local" and typed.eval.every == typed.trainer.batch_groups and not params
        from opd.experiment import default_objective

        assert default_objective(typed) == "summary/final_sampled_accuracy"
    else:
        # Sweep presets vary reward weights that exist in the chosen env's reward schema.
        assert params and all(key.startswith("reward.weights.") for key in params)
        for key in params:
            assert hasattr(typed.reward.weights, key.rsplit(".", 1)[1])
    if preset == "optuna_rewards":
        # The run's default objective: the written groups' accuracy, held-out accuracy with evaluation.
        from opd.experiment import default_objective

        assert typed.sweep.objective is None and default_objective(typed) == "accuracy"
        with_eval = validate(compose(["experiment=optuna_rewards", "trainer=local", "eval.every=4"]))
        assert default_objective(with_eval) == "summary/final_accuracy"
    if preset == "reward_sweep_closed_loop":
        # Ranked by the paired gain over each job's own start, two training seeds per setting.
        assert typed.trainer.kind == "local" and typed.sweep.objective == "summary/eval_paired_gain" and typed.sweep.seeds == 2


def test_slurm_launcher_config_extends_submitit() -> None:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "output_dir=/x"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert cfg.hydra.launcher.partition == "gpu" and cfg.hydra.launcher.timeout_min == 240


BAD_RUNS = [
    # (overrides, message naming the key)
    (["total_steps=abc"], "total_steps"),
    (["+no_such_knob=1"], "no_such_knob"),
    (["env=no_such_env"], "env"),
    (["group_size=0"], "group_size must be >= 1, got 0"),
    (["server=vllm", "server.model=m", "server.base_urls=[http://127.0.0.1:9/v1]", "distill_topk=30"], "server.max_logprobs must be >= distill_topk (30)"),
    (["dataset=math_local", "dataset.path=/nonexistent/problems.jsonl"], "dataset.path: no such file"),
    (["dataset=acereason_math", "dataset.path=nobody/no-such-dataset"], "dataset.path: could not load hub dataset 'nobody/no-such-dataset'"),
    (["tracking.uri=bogus-scheme://nowhere"], "tracking.uri: cannot open the MLflow store 'bogus-scheme://nowhere'"),
    (["resume=true"], "resume: no "),
    (["resume=true", "trainer=local"], "resume: a run with trainer=local cannot be resumed"),
    (["trainer.kind=local"], "trainer.kind must be none or atropos here; choose the local trainer with trainer=local"),
    (["mode=serve", "serve.rollout_server_url=ftp://x"], "serve.rollout_server_url must be an http(s) URL"),
    (["server=vllm"], "server.model must be set: server=vllm needs the model name its servers serve: server.model=NAME"),
    (["server=vllm", "server.model=m"], "server.base_urls must be set: server=vllm needs its servers' addresses"),
    (["dataset=math_local"], "dataset.path must be set when dataset.source=local"),
    (["mode=trian"], "mode must be one of ['train', 'evaluate', 'serve'], got 'trian'; did you mean train?"),
    (["+total_step=3"], "unknown config key(s): total_step (did you mean total_steps?)"),
    # Top-K above the model's vocabulary (the fixture's 4,096): vLLM's engine would die a minute in.
    (["distill_topk=10000"], "distill_topk must be <= the model's vocabulary (4096 tokens"),
    (["server.max_logprobs=5000"], "server.max_logprobs must be <= the model's vocabulary (4096 tokens"),
    # Running servers that were never up: within seconds, not after server.unreachable_timeout_s.
    (["server=vllm", "server.model=fixture", "server.base_urls=[http://127.0.0.1:9/v1]"], "server.base_urls: nothing answers at http://127.0.0.1:9/v1"),
    (["server=vllm", "server.model=fixture", "server.base_urls=[http://no-such-host.invalid:8000/v1]"], "server.base_urls: nothing answers at"),
    (["env=opd_coding", "judge=server", "judge.base_url=http://127.0.0.1:9/v1", "judge.model=j", "server=vllm", "server.model=fixture",
      "server.base_urls=[http://127.0.0.1:9/v1]", "server.unreachable_timeout_s=300"], "server.base_urls: nothing answers"),
    (["env=opd_coding", "judge=server", "judge.base_url=http://127.0.0.1:9/v1", "judge.model=j", "judge.tokenizer=/no/such/judge"],
     "judge.tokenizer='/no/such/judge': no such directory"),
    (["trainer=local", "trainer.opd_clamp=0"], "trainer.opd_clamp must be > 0 or null (unbounded), got 0"),
    (["trainer=local", "trainer.equal_score_groups=ignore"], "trainer.equal_score_groups must be one of ['drop', 'keep']"),
    (["trainer=local", "trainer.refresh_check.tolerance=0.5"], "trainer.refresh_check.tolerance must be >= 1.0"),
    (["trainer=local", "trainer.refresh_check.dtype=int8"], "trainer.refresh_check.dtype must be one of"),
    (["eval.seed=-1"], "eval.seed must be in [0, 2**31) or null (unseeded)"),
    (["eval.confidence=1.5"], "eval.confidence must be in (0, 1)"),
    (["sweep.seeds=0"], "sweep.seeds must be >= 1"),
    # A loss that would train nothing: its only weighted term needs teacher rows that nothing writes.
    (["trainer=local", "trainer.loss.pg=0"], "trainer.loss: opd_advantage=1 needs teacher rows and env=inline_math without a teacher writes none"),
    (["arm=opd"], "trainer.loss: opd_advantage=1 needs teacher rows and env=inline_math without a teacher writes none, so trainer=local would train nothing"),
    (["env=opd_coding", "env.opd.enabled=false", "arm=opd", "trainer.loss.topk_kl=0.5"],
     "trainer.loss: opd_advantage=1, topk_kl=0.5 need teacher rows and teacher=self_hint with env.opd.enabled=false writes none"),
    (["trainer=local", "trainer.loss.pg=0", "trainer.loss.opd_advantage=0"], "trainer.loss must be weights that are not all 0"),
    (["trainer=local", "trainer.loss.topk_kl=-1"], "trainer.loss.topk_kl must be >= 0"),
    (["env=opd_coding", "reward.pass_threshold=1.5"], "reward.pass_threshold must be in [0, 1]"),
    (["sinks=[mlflow,wandb]"], "sinks: no sink named 'wandb'"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_RUNS, ids=[" ".join(o)[:60] for o, _ in BAD_RUNS])
def test_bad_runs_fail_with_one_clear_message_before_any_server_starts(tmp_path, overrides: list[str], message: str) -> None:
    import time

    from experiments.launch import launch

    started = time.monotonic()
    with pytest.raises((ConfigError, ConfigCompositionException)) as info:
        launch(compose([f"output_dir={tmp_path / 'run'}", f"tracking.artifact_root={tmp_path / 'mlruns'}", *overrides]))
    text = f"{info.value} {info.value.__cause__ or ''}"
    assert message in text
    assert time.monotonic() - started < 30
    if isinstance(info.value, ConfigError):
        assert "\n" not in str(info.value)  # one line
    assert not (tmp_path / "run" / "vllm").exists()  # no server was started


PRESETS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))


@pytest.mark.parametrize("preset", one_fast(PRESETS, ("fixture", "qwen3")))
@pytest.mark.parametrize("env", ["inline_math", "opd_coding"])
def test_every_model_preset_composes_with_both_envs_and_both_servers(preset: str, env: str) -> None:
    cfg = validate(compose([f"model={preset}", f"env={env}", "server.model=/models/mine"]))
    budgets = getattr(cfg.model, env)
    assert cfg.server.model == "/models/mine" and cfg.server.max_model_len == budgets.max_model_len
    assert cfg.server.tool_call_parser == cfg.model.tool_call_parser and cfg.server.reasoning_parser == cfg.model.reasoning_parser
    assert cfg.env.temperature == budgets.temperature
    if env == "opd_coding":
        assert (cfg.env.max_turns, cfg.env.max_tokens_per_turn, cfg.judge.max_tokens) == (budgets.max_turns, budgets.max_tokens_per_turn, budgets.judge_max_tokens)
    else:
        assert (cfg.env.max_tool_calls, cfg.env.max_new_tokens, cfg.env.max_tokens_per_segment) == (budgets.max_tool_calls, budgets.max_new_tokens, budgets.max_tokens_per_segment)
    remote = validate(compose([f"model={preset}", f"env={env}", "server=vllm", "server.model=m", "server.base_urls=[http://h:8000/v1]"]))
    assert remote.server.max_model_len == budgets.max_model_len


def test_fixture_keeps_todays_budgets_and_real_presets_take_the_references() -> None:
    fixture = validate(compose(["env=inline_math"]))
    assert fixture.model.name == "fixture" and fixture.server.model == "fixture" and fixture.server.max_model_len == 4096
    assert (fixture.env.max_new_tokens, fixture.env.max_tokens_per_segment, fixture.env.temperature) == (512, 256, 1.0)
    coding = validate(compose(["env=opd_coding"]))
    assert (coding.env.max_turns, coding.env.max_tokens_per_turn, coding.judge.max_tokens) == (15, 512, 1024)
    qwen = validate(compose(["model=qwen3", "env=inline_math", "server.model=/m"]))
    # The inline reference: 3 tool segments x 512 new tokens, 8,192 context; Qwen3 samples as its
    # model card says (thinking mode), also when evaluating.
    assert (qwen.env.max_tool_calls, qwen.env.max_tokens_per_segment, qwen.server.max_model_len) == (3, 512, 8192)
    assert (qwen.env.temperature, qwen.env.sampling, qwen.env.eval_temperature) == (0.6, {"top_p": 0.95, "top_k": 20, "min_p": 0.0}, 0.6)
    # A non-thinking preset keeps the reference's temperature and leaves the rest to the model's
    # generation_config.json; it evaluates greedily.
    llama = validate(compose(["model=llama3", "env=inline_math", "server.model=/m"]))
    assert (llama.env.temperature, llama.env.sampling, llama.env.eval_temperature) == (0.8, {}, 0.0)
    assert fixture.env.sampling == {"top_p": 1.0} and fixture.env.eval_temperature == 0.0
    assert qwen.model.chat_template_kwargs == {"enable_thinking": True} and qwen.server.reasoning_parser == "qwen3"
    # An env key still overrides the preset's value.
    assert validate(compose(["model=qwen3", "env=inline_math", "env.max_new_tokens=99"])).env.max_new_tokens == 99
