"""The typed configuration schema, registered in Hydra's ConfigStore.

The YAML tree in `conf/` is the one source of every value and of the comment that explains it;
these dataclasses give the types (OmegaConf checks them, and unknown keys, when Hydra composes
the config, naming the full key) and the ranges and combinations (checked in `__post_init__`
when `validate()` turns the composed config into these objects, before any server starts).
No field has a default here: a value missing from the YAML is an error, not a silent default.
Code outside a Hydra run gets a config with `compose(overrides)`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


class ConfigError(ValueError):
    """A configuration value is out of range or inconsistent; the message names the key."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


# The project's root: relative paths in the config (e.g. model.chat_template) are read from here
# when they are not found from the working directory.
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def project_path(path: str) -> Path:
    """`path` as given when it exists (or is absolute), else relative to the project's root."""
    given = Path(path).expanduser()
    return given if given.is_absolute() or given.exists() else PROJECT_ROOT / given


def _check(condition: bool, key: str, rule: str, value: Any) -> None:
    if not condition:
        raise ConfigError(f"{key} must be {rule}, got {value!r}", key)


def _at_least(key: str, value: float, minimum: float) -> None:
    _check(value >= minimum, key, f">= {minimum}", value)


def _one_of(key: str, value: Any, allowed: tuple[Any, ...]) -> None:
    if value not in allowed:
        import difflib

        close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ConfigError(f"{key} must be one of {list(allowed)}, got {value!r}{hint}", key)


def _fraction(key: str, value: float) -> None:
    _check(0 <= value <= 1, key, "in [0, 1]", value)


# ---- the model preset (conf/model/) -----------------------------------------------------------


@dataclass
class ModelInlineMath:
    """model.inline_math: budgets and sampling of env=inline_math with this model."""

    max_model_len: int = MISSING
    max_tool_calls: int = MISSING
    max_tokens_per_segment: int = MISSING
    max_new_tokens: int = MISSING
    temperature: float = MISSING
    tool_instruction: bool = MISSING


@dataclass
class ModelSampling:
    """model.sampling: the vendor's recommended sampling, in both environments (null: not sent,
    so the model's own generation_config.json decides)."""

    top_p: Optional[float] = MISSING
    top_k: Optional[int] = MISSING
    min_p: Optional[float] = MISSING
    eval_temperature: float = MISSING


@dataclass
class ModelCoding:
    """model.opd_coding: budgets and sampling of env=opd_coding with this model."""

    max_model_len: int = MISSING
    max_turns: int = MISSING
    max_tokens_per_turn: int = MISSING
    temperature: float = MISSING
    judge_max_tokens: int = MISSING
    show_tests: bool = MISSING


@dataclass
class ModelConfig:
    """model=<preset>: the model family's formats and budgets (conf/model/fixture.yaml documents
    each field). The envs, the server and the judge read their defaults from here."""

    name: str = MISSING
    path: str = MISSING
    dtype: str = MISSING
    tool_call_parser: str = MISSING
    reasoning_parser: Optional[str] = MISSING
    tool_call_start: str = MISSING
    tool_call_end: str = MISSING
    call_template: str = MISSING
    tool_response_template: str = MISSING
    required_tokens: list[str] = MISSING
    chat_template: Optional[str] = MISSING
    chat_template_kwargs: dict[str, Any] = MISSING
    tool_call_ids: Optional[str] = MISSING
    reasoning_end: str = MISSING
    sampling: ModelSampling = MISSING
    inline_math: ModelInlineMath = MISSING
    opd_coding: ModelCoding = MISSING

    def __post_init__(self) -> None:
        _check(bool(self.tool_call_parser), "model.tool_call_parser", "a vLLM --tool-call-parser name", self.tool_call_parser)
        _check(bool(self.tool_call_start) and bool(self.tool_call_end), "model.tool_call_start/tool_call_end", "non-empty markers",
               (self.tool_call_start, self.tool_call_end))
        _check("$arguments" in self.call_template and ("$name" in self.call_template or "$function" in self.call_template),
               "model.call_template", "a template with $arguments and $name (JSON) or $function (bare)", self.call_template)
        _check("$result" in self.tool_response_template, "model.tool_response_template", "a template with $result", self.tool_response_template)
        _one_of("model.tool_call_ids", self.tool_call_ids, (None, "mistral"))
        for env in ("inline_math", "opd_coding"):
            _at_least(f"model.{env}.max_model_len", getattr(self, env).max_model_len, 16)


# ---- inference servers (conf/server/) -------------------------------------------------------


@dataclass
class ServerConfig:
    """What every kind of server setting has (conf/server/local.yaml documents each field)."""

    kind: str = MISSING
    model: str = MISSING
    max_model_len: int = MISSING
    max_logprobs: int = MISSING
    request_timeout_s: float = MISSING
    max_requests_in_flight: int = MISSING
    max_attempts: int = MISSING
    api_key: str = MISSING
    unreachable_timeout_s: float = MISSING

    def __post_init__(self) -> None:
        _at_least("server.max_model_len", self.max_model_len, 16)
        _at_least("server.max_logprobs", self.max_logprobs, 1)
        _at_least("server.request_timeout_s", self.request_timeout_s, 0.1)
        _at_least("server.max_requests_in_flight", self.max_requests_in_flight, 1)
        _at_least("server.max_attempts", self.max_attempts, 1)
        _check(bool(self.api_key), "server.api_key", "a non-empty string", self.api_key)
        _at_least("server.unreachable_timeout_s", self.unreachable_timeout_s, 0)


@dataclass
class LocalServerConfig(ServerConfig):
    """server=local: vLLM started by the run (conf/server/local.yaml)."""

    dtype: str = MISSING
    tool_call_parser: Optional[str] = MISSING
    reasoning_parser: Optional[str] = MISSING
    chat_template: Optional[str] = MISSING
    cpu_kv_cache_gib: int = MISSING
    enforce_eager: bool = MISSING
    startup_timeout_s: float = MISSING
    extra_args: list[str] = MISSING
    environment: dict[str, str] = MISSING
    max_restarts: int = MISSING

    def __post_init__(self) -> None:
        super().__post_init__()
        _one_of("server.kind", self.kind, ("local",))
        _at_least("server.cpu_kv_cache_gib", self.cpu_kv_cache_gib, 1)
        _at_least("server.startup_timeout_s", self.startup_timeout_s, 1)
        _at_least("server.max_restarts", self.max_restarts, 0)


@dataclass
class RemoteServerConfig(ServerConfig):
    """server=vllm: running servers (conf/server/vllm.yaml)."""

    base_urls: list[str] = MISSING

    def __post_init__(self) -> None:
        super().__post_init__()
        _one_of("server.kind", self.kind, ("vllm",))
        _check(len(self.base_urls) > 0, "server.base_urls", "a non-empty list when server.kind=vllm", self.base_urls)
        for url in self.base_urls:
            _check(url.startswith(("http://", "https://")), "server.base_urls", "http(s) URLs", url)


# ---- data (conf/dataset/) -------------------------------------------------------------------


@dataclass
class DatasetConfig:
    """The tasks (conf/dataset/base.yaml documents each field)."""

    name: str = MISSING
    source: str = MISSING
    path: Optional[str] = MISSING
    subset: Optional[str] = MISSING
    split: str = MISSING
    streaming: bool = MISSING
    prompt_field: str = MISSING
    answer_field: str = MISSING
    tests_field: str = MISSING
    numeric_answers_only: bool = MISSING
    max_rows: Optional[int] = MISSING
    eval_size: int = MISSING
    split_seed: int = MISSING
    builtin_size: int = MISSING
    kinds: Optional[list[str]] = MISSING

    def __post_init__(self) -> None:
        _one_of("dataset.source", self.source, ("builtin", "local", "hub", "humaneval"))
        if self.source in ("local", "hub"):
            _check(bool(self.path), "dataset.path", f"set when dataset.source={self.source}", self.path)
        if self.max_rows is not None:
            _at_least("dataset.max_rows", self.max_rows, 1)
        _at_least("dataset.eval_size", self.eval_size, 0)
        _at_least("dataset.builtin_size", self.builtin_size, 2)
        if self.kinds is not None:
            _check(len(self.kinds) > 0, "dataset.kinds", "name at least one kind, or null for all", self.kinds)


# ---- environments (conf/env/, conf/sandbox/) -------------------------------------------------


@dataclass
class SandboxConfig:
    """The jail of one sandboxed call (conf/sandbox/default.yaml); `opd.tools.sandbox` reads it as is."""

    backend: str = MISSING
    timeout_s: float = MISSING
    cpu_s: int = MISSING
    memory_mb: int = MISSING
    file_size_mb: int = MISSING
    max_processes: int = MISSING
    max_open_files: int = MISSING
    tmp_mb: int = MISSING
    tmp_files: int = MISSING
    workspace_mb: int = MISSING
    workspace_files: int = MISSING
    output_chars: int = MISSING
    isolate_network: bool = MISSING
    uid_base: int = MISSING

    def __post_init__(self) -> None:
        if self.backend == "unshare":
            # It ran jailed code without a mount namespace: the launcher's file tools could be led
            # through the code's hard links, and it shared /tmp and /var/tmp with the machine.
            raise ConfigError("env.sandbox.backend=unshare was removed: it gave jailed code no mount isolation (shared /tmp, the "
                              "launcher's file tools led through its hard links). Use bwrap (the default; scripts/install.sh installs "
                              "the Debian package bubblewrap, or `apt-get install bubblewrap`)", "env.sandbox.backend")
        _one_of("env.sandbox.backend", self.backend, ("bwrap",))
        for key in ("timeout_s", "cpu_s", "memory_mb", "file_size_mb", "max_processes", "output_chars", "tmp_mb", "workspace_mb"):
            _at_least(f"env.sandbox.{key}", getattr(self, key), 1)
        for key in ("tmp_files", "workspace_files"):  # room for the files the harness and the prompt put there
            _at_least(f"env.sandbox.{key}", getattr(self, key), 16)
        _at_least("env.sandbox.max_open_files", self.max_open_files, 8)
        _check(1000 <= self.uid_base <= 2**32 - 70_000, "env.sandbox.uid_base", "in [1000, 2^32 - 70000]", self.uid_base)


@dataclass
class EnvConfig:
    """Fields every environment has (conf/env/common/sampling.yaml)."""

    name: str = MISSING
    spec: Optional[str] = MISSING
    temperature: float = MISSING
    top_p: Optional[float] = MISSING
    top_k: Optional[int] = MISSING
    min_p: Optional[float] = MISSING
    eval_temperature: float = MISSING

    def __post_init__(self) -> None:
        _check(0 <= self.temperature <= 5, "env.temperature", "in [0, 5]", self.temperature)
        _check(self.top_p is None or 0 < self.top_p <= 1, "env.top_p", "null or in (0, 1]", self.top_p)
        _check(self.top_k is None or self.top_k == -1 or self.top_k >= 1, "env.top_k", "null, -1 (off) or >= 1", self.top_k)
        _check(self.min_p is None or 0 <= self.min_p <= 1, "env.min_p", "null or in [0, 1]", self.min_p)
        _check(0 <= self.eval_temperature <= 5, "env.eval_temperature", "in [0, 5]", self.eval_temperature)

    @property
    def sampling(self) -> dict[str, Any]:
        """top_p, top_k and min_p as request fields; a null one is not sent (the model's
        generation_config.json decides it)."""
        return {k: v for k, v in (("top_p", self.top_p), ("top_k", self.top_k), ("min_p", self.min_p)) if v is not None}


@dataclass
class InlineMathEnvConfig(EnvConfig):
    """env=inline_math (conf/env/inline_math.yaml)."""

    max_tool_calls: int = MISSING
    max_new_tokens: int = MISSING
    max_tokens_per_segment: int = MISSING
    few_shots: int = MISSING
    dynamic_pool_size: int = MISSING
    dynamic_shots: int = MISSING
    problem_suffix: str = MISSING
    tool_instruction: bool = MISSING
    calculator_max_chars: int = MISSING
    drop_equal_scores: Optional[bool] = MISSING
    sandbox: SandboxConfig = MISSING

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
class OPDConfig:
    """env.opd of opd_coding (conf/env/opd_coding.yaml)."""

    enabled: bool = MISSING
    topk: int = MISSING
    hint_placement: str = MISSING
    hint_header: str = MISSING
    max_state_chars: int = MISSING
    max_response_chars: Optional[int] = MISSING
    response_cut: str = MISSING
    max_concurrency: int = MISSING

    def __post_init__(self) -> None:
        _at_least("env.opd.topk", self.topk, 1)
        _one_of("env.opd.hint_placement", self.hint_placement, ("last_user", "system", "new_user"))
        _at_least("env.opd.max_state_chars", self.max_state_chars, 1)
        if self.max_response_chars is not None:
            _at_least("env.opd.max_response_chars", self.max_response_chars, 1)
        _one_of("env.opd.response_cut", self.response_cut, ("tail", "head"))
        _at_least("env.opd.max_concurrency", self.max_concurrency, 1)


@dataclass
class OPDCodingEnvConfig(EnvConfig):
    """env=opd_coding (conf/env/opd_coding.yaml)."""

    max_turns: int = MISSING
    max_tokens_per_turn: int = MISSING
    system_prompt: Optional[str] = MISSING
    show_tests: bool = MISSING
    max_file_chars: int = MISSING
    sandbox: SandboxConfig = MISSING
    opd: OPDConfig = MISSING

    def __post_init__(self) -> None:
        super().__post_init__()
        _at_least("env.max_turns", self.max_turns, 1)
        _at_least("env.max_tokens_per_turn", self.max_tokens_per_turn, 1)
        _at_least("env.max_file_chars", self.max_file_chars, 1)


# ---- rewards (conf/reward/) ---------------------------------------------------------------


@dataclass
class InlineMathWeights:
    """reward.weights of inline_math: one weight per signal of `opd.rewards.math`."""

    correct: float = MISSING
    incorrect: float = MISSING
    tool_use: float = MISSING
    format_violation: float = MISSING


@dataclass
class InlineMathRewardConfig:
    """reward=inline_math (conf/reward/inline_math.yaml)."""

    weights: InlineMathWeights = MISSING
    format_penalty: str = MISSING
    flat_format_score: float = MISSING
    max_answer_chars: int = MISSING
    verify_timeout_s: float = MISSING
    verify_workers: int = MISSING

    def __post_init__(self) -> None:
        _check(self.weights.correct > self.weights.incorrect, "reward.weights.correct", "> reward.weights.incorrect", self.weights.correct)
        _at_least("reward.weights.tool_use", self.weights.tool_use, 0)
        _check(self.weights.format_violation <= 0, "reward.weights.format_violation", "<= 0", self.weights.format_violation)
        _one_of("reward.format_penalty", self.format_penalty, ("flat", "additive"))
        _at_least("reward.max_answer_chars", self.max_answer_chars, 1)
        _at_least("reward.verify_timeout_s", self.verify_timeout_s, 0.1)
        _at_least("reward.verify_workers", self.verify_workers, 1)


@dataclass
class CodingWeights:
    """reward.weights of opd_coding: one weight per signal of `opd.rewards.coding`."""

    correctness: float = MISSING
    efficiency: float = MISSING
    tool_usage: float = MISSING


@dataclass
class CorrectnessLevels:
    passed: float = MISSING
    assertion: float = MISSING
    crash: float = MISSING
    nothing_written: float = MISSING


@dataclass
class Efficiency:
    best_turns: int = MISSING
    steps: list[list[float]] = MISSING
    floor: float = MISSING


@dataclass
class ToolUsage:
    write_and_run: float = MISSING
    run_only: float = MISSING
    other: float = MISSING


@dataclass
class OPDCodingRewardConfig:
    """reward=opd_coding (conf/reward/opd_coding.yaml)."""

    weights: CodingWeights = MISSING
    correctness_levels: CorrectnessLevels = MISSING
    efficiency: Efficiency = MISSING
    tool_usage: ToolUsage = MISSING
    tests_timeout_s: float = MISSING
    max_solution_chars: int = MISSING
    clamp: Optional[list[float]] = MISSING
    pass_threshold: float = MISSING

    def __post_init__(self) -> None:
        _fraction("reward.pass_threshold", self.pass_threshold)
        if self.clamp is not None:
            _check(len(self.clamp) == 2 and self.clamp[0] <= self.clamp[1], "reward.clamp", "[low, high] with low <= high, or null", self.clamp)
        for name in ("correctness", "efficiency", "tool_usage"):
            _at_least(f"reward.weights.{name}", getattr(self.weights, name), 0)
        for name in ("passed", "assertion", "crash", "nothing_written"):
            _fraction(f"reward.correctness_levels.{name}", getattr(self.correctness_levels, name))
        _at_least("reward.efficiency.best_turns", self.efficiency.best_turns, 0)
        for step in self.efficiency.steps:
            _check(len(step) == 2 and 0 < step[0] <= 1 and 0 <= step[1] <= 1, "reward.efficiency.steps", "[fraction in (0, 1], score in [0, 1]] pairs", step)
        _fraction("reward.efficiency.floor", self.efficiency.floor)
        for name in ("write_and_run", "run_only", "other"):
            _fraction(f"reward.tool_usage.{name}", getattr(self.tool_usage, name))
        _at_least("reward.tests_timeout_s", self.tests_timeout_s, 1)
        _at_least("reward.max_solution_chars", self.max_solution_chars, 1)


# ---- the judge (conf/judge/) ----------------------------------------------------------------


@dataclass
class JudgeConfig:
    """judge=policy: the judge runs on the policy's server (conf/judge/policy.yaml)."""

    kind: str = MISSING
    votes: int = MISSING
    votes_in_one_request: bool = MISSING
    retry_votes_alone: bool = MISSING
    max_tokens: int = MISSING
    temperature: float = MISSING
    decision_rule: str = MISSING
    hint_choice: str = MISSING
    min_hint_chars: int = MISSING

    def __post_init__(self) -> None:
        _one_of("judge.kind", self.kind, ("policy", "server"))
        _at_least("judge.votes", self.votes, 1)
        _at_least("judge.max_tokens", self.max_tokens, 1)
        _check(0 <= self.temperature <= 5, "judge.temperature", "in [0, 5]", self.temperature)
        _one_of("judge.decision_rule", self.decision_rule, ("majority", "any", "unanimous"))
        _one_of("judge.hint_choice", self.hint_choice, ("longest", "first"))
        _at_least("judge.min_hint_chars", self.min_hint_chars, 0)


@dataclass
class JudgeServerConfig(JudgeConfig):
    """judge=server: the judge on its own OpenAI-compatible server (conf/judge/server.yaml)."""

    base_url: str = MISSING
    model: str = MISSING
    api_key: str = MISSING

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.kind == "server", "judge.kind", "server with judge=server's fields", self.kind)
        _check(self.base_url.startswith(("http://", "https://")), "judge.base_url", "an http(s) URL", self.base_url)
        _check(bool(self.model), "judge.model", "set when judge.kind=server", self.model)


# ---- the teacher (conf/teacher/) --------------------------------------------------------------


@dataclass
class TeacherConfig:
    """teacher=none | self_hint (conf/teacher/): no teacher, or the policy given a hindsight hint."""

    kind: str = MISSING
    hint: bool = MISSING

    def __post_init__(self) -> None:
        _one_of("teacher.kind", self.kind, ("none", "self_hint", "model"))
        if type(self) is TeacherConfig:
            _check(self.kind != "model", "teacher.kind", "none or self_hint here; choose a teacher model with teacher=model", self.kind)
            _check(self.hint == (self.kind == "self_hint"), "teacher.hint", f"{self.kind == 'self_hint'} with teacher={self.kind}", self.hint)


@dataclass
class TeacherServerConfig:
    """teacher.server of teacher=model: where the teacher runs (conf/teacher/model.yaml)."""

    model: str = MISSING
    base_url: Optional[str] = MISSING
    api_key: str = MISSING
    dtype: str = MISSING
    max_model_len: int = MISSING
    cpu_kv_cache_gib: int = MISSING
    startup_timeout_s: float = MISSING
    extra_args: list[str] = MISSING

    def __post_init__(self) -> None:
        _check(bool(self.model), "teacher.server.model", "a model directory or name", self.model)
        if self.base_url is not None:
            _check(self.base_url.startswith(("http://", "https://")), "teacher.server.base_url", "an http(s) URL or null (served here)", self.base_url)
        _at_least("teacher.server.max_model_len", self.max_model_len, 16)
        _at_least("teacher.server.cpu_kv_cache_gib", self.cpu_kv_cache_gib, 1)
        _at_least("teacher.server.startup_timeout_s", self.startup_timeout_s, 1)


@dataclass
class ModelTeacherConfig(TeacherConfig):
    """teacher=model: a separate model scores every sampled token (conf/teacher/model.yaml)."""

    topk: int = MISSING
    max_concurrent: int = MISSING
    server: TeacherServerConfig = MISSING

    def __post_init__(self) -> None:
        super().__post_init__()
        _one_of("teacher.kind", self.kind, ("model",))
        _at_least("teacher.topk", self.topk, 1)
        _at_least("teacher.max_concurrent", self.max_concurrent, 1)


# ---- the run (conf/tracking/, conf/runner/, conf/config.yaml) --------------------------------


@dataclass
class TrackingConfig:
    """MLflow (conf/tracking/mlflow.yaml)."""

    enabled: bool = MISSING
    uri: str = MISSING
    artifact_root: Optional[str] = MISSING
    experiment: str = MISSING
    run_name: Optional[str] = MISSING
    max_param_chars: int = MISSING
    log_data_artifacts: bool = MISSING
    log_input: bool = MISSING
    traces: bool = MISSING
    traces_max_rollouts: int = MISSING

    def __post_init__(self) -> None:
        _check(bool(self.uri), "tracking.uri", "a non-empty MLflow URI", self.uri)
        _at_least("tracking.max_param_chars", self.max_param_chars, 16)
        _at_least("tracking.traces_max_rollouts", self.traces_max_rollouts, 0)


@dataclass
class SweepConfig:
    """Sweeps (conf/config.yaml, `sweep`)."""

    share_server: bool = MISSING
    objective: Optional[str] = MISSING
    seeds: int = MISSING

    def __post_init__(self) -> None:
        _at_least("sweep.seeds", self.seeds, 1)


@dataclass
class ServeConfig:
    """mode=serve: the Atropos trainer API (conf/config.yaml, `serve`)."""

    rollout_server_url: str = MISSING
    env_name: str = MISSING
    weight: float = MISSING
    max_batches_offpolicy: int = MISSING
    poll_interval_s: float = MISSING
    wait_timeout_s: float = MISSING
    request_timeout_s: float = MISSING
    max_attempts: int = MISSING

    def __post_init__(self) -> None:
        _check(self.rollout_server_url.startswith(("http://", "https://")), "serve.rollout_server_url", "an http(s) URL", self.rollout_server_url)
        _check(self.weight > 0, "serve.weight", "> 0", self.weight)
        _at_least("serve.max_batches_offpolicy", self.max_batches_offpolicy, 1)
        _check(self.poll_interval_s > 0, "serve.poll_interval_s", "> 0", self.poll_interval_s)
        _check(self.wait_timeout_s > 0, "serve.wait_timeout_s", "> 0", self.wait_timeout_s)
        _check(self.request_timeout_s > 0, "serve.request_timeout_s", "> 0", self.request_timeout_s)
        _at_least("serve.max_attempts", self.max_attempts, 1)


@dataclass
class RayConfig:
    """runner.workers > 1: the Ray cluster the environment workers run on (conf/runner/default.yaml)."""

    address: Optional[str] = MISSING
    num_cpus: Optional[int] = MISSING
    cpus_per_worker: float = MISSING
    object_store_mb: int = MISSING
    startup_timeout_s: float = MISSING
    max_restarts: int = MISSING

    def __post_init__(self) -> None:
        if self.num_cpus is not None:
            _at_least("runner.ray.num_cpus", self.num_cpus, 1)
        _check(self.cpus_per_worker > 0, "runner.ray.cpus_per_worker", "> 0", self.cpus_per_worker)
        _at_least("runner.ray.object_store_mb", self.object_store_mb, 75)  # Ray's own minimum
        _check(self.startup_timeout_s > 0, "runner.ray.startup_timeout_s", "> 0", self.startup_timeout_s)
        _at_least("runner.ray.max_restarts", self.max_restarts, 0)


@dataclass
class RunnerConfig:
    """The generation loop (conf/runner/default.yaml)."""

    groups_in_flight: Optional[int] = MISSING
    oversubscribe: float = MISSING
    uvloop: bool = MISSING
    max_attempts_per_item: int = MISSING
    max_failed_groups: int = MISSING
    max_dropped_groups: Optional[int] = MISSING
    progress: bool = MISSING
    fsync: bool = MISSING
    workers: int = MISSING
    ray: RayConfig = MISSING

    def __post_init__(self) -> None:
        _at_least("runner.workers", self.workers, 1)
        if self.groups_in_flight is not None:
            _at_least("runner.groups_in_flight", self.groups_in_flight, 1)
        _check(self.oversubscribe >= 1, "runner.oversubscribe", ">= 1", self.oversubscribe)
        _at_least("runner.max_attempts_per_item", self.max_attempts_per_item, 1)
        _at_least("runner.max_failed_groups", self.max_failed_groups, 0)
        if self.max_dropped_groups is not None:
            _at_least("runner.max_dropped_groups", self.max_dropped_groups, 0)


@dataclass
class TrainerConfig:
    """trainer=none | atropos (conf/trainer/): no trainer in the run, or an external one."""

    kind: str = MISSING

    def __post_init__(self) -> None:
        if type(self) is TrainerConfig:
            # trainer=local has settings of its own (conf/trainer/local.yaml): chosen as a group.
            _check(self.kind != "local", "trainer.kind", "none or atropos here; choose the local trainer with trainer=local", self.kind)
        _one_of("trainer.kind", self.kind, ("none", "local", "atropos"))


@dataclass
class RefreshCheckConfig:
    """trainer.refresh_check: the served weights checked against the trainer's after each refresh."""

    enabled: bool = MISSING
    tokens: int = MISSING
    tolerance: float = MISSING
    max_start: float = MISSING
    dtype: str = MISSING

    def __post_init__(self) -> None:
        _one_of("trainer.refresh_check.dtype", self.dtype, ("auto", "bfloat16", "float16", "half", "float32", "float"))
        _at_least("trainer.refresh_check.tokens", self.tokens, 16)
        _at_least("trainer.refresh_check.tolerance", self.tolerance, 1.0)
        _check(self.max_start > 0, "trainer.refresh_check.max_start", "> 0", self.max_start)


@dataclass
class LocalTrainerConfig(TrainerConfig):
    """trainer=local: the reference trainer in the run (conf/trainer/local.yaml)."""

    batch_groups: int = MISSING
    learning_rate: float = MISSING
    weight_decay: float = MISSING
    max_grad_norm: float = MISSING
    clip: float = MISSING
    opd_clamp: Optional[float] = MISSING
    equal_score_groups: str = MISSING
    loss: Dict[str, float] = MISSING
    micro_batch: int = MISSING
    max_tokens: Optional[int] = MISSING
    max_staleness: int = MISSING
    refresh: bool = MISSING
    refresh_check: RefreshCheckConfig = MISSING
    threads: int = MISSING
    seed: int = MISSING

    def __post_init__(self) -> None:
        super().__post_init__()
        _one_of("trainer.kind", self.kind, ("local",))
        _at_least("trainer.batch_groups", self.batch_groups, 1)
        _check(self.learning_rate > 0, "trainer.learning_rate", "> 0", self.learning_rate)
        _at_least("trainer.weight_decay", self.weight_decay, 0)
        _check(self.max_grad_norm > 0, "trainer.max_grad_norm", "> 0", self.max_grad_norm)
        _check(0 < self.clip < 1, "trainer.clip", "in (0, 1)", self.clip)
        if self.opd_clamp is not None:
            _check(self.opd_clamp > 0, "trainer.opd_clamp", "> 0 or null (unbounded)", self.opd_clamp)
        _one_of("trainer.equal_score_groups", self.equal_score_groups, ("drop", "keep"))
        for name, weight in self.loss.items():
            _at_least(f"trainer.loss.{name}", weight, 0)
        _check(sum(self.loss.values()) > 0, "trainer.loss", "weights that are not all 0", dict(self.loss))
        _at_least("trainer.micro_batch", self.micro_batch, 1)
        if self.max_tokens is not None:
            _at_least("trainer.max_tokens", self.max_tokens, 2)
        _at_least("trainer.max_staleness", self.max_staleness, 0)
        _at_least("trainer.threads", self.threads, 0)


@dataclass
class EvalConfig:
    """Evaluation of the held-out split (conf/config.yaml, `eval`)."""

    every: Optional[int] = MISSING
    samples_per_item: int = MISSING
    temperature: float = MISSING
    max_items: Optional[int] = MISSING
    seed: Optional[int] = MISSING
    confidence: float = MISSING

    def __post_init__(self) -> None:
        if self.every is not None:
            _at_least("eval.every", self.every, 1)
        _at_least("eval.samples_per_item", self.samples_per_item, 0)
        _check(0 <= self.temperature <= 5, "eval.temperature", "in [0, 5]", self.temperature)
        if self.max_items is not None:
            _at_least("eval.max_items", self.max_items, 1)
        if self.seed is not None:
            _check(0 <= self.seed < 2**31, "eval.seed", "in [0, 2**31) or null (unseeded)", self.seed)
        _check(0 < self.confidence < 1, "eval.confidence", "in (0, 1)", self.confidence)


@dataclass
class Config:
    """The root (conf/config.yaml); the groups' schemas come from the chosen options."""

    model: ModelConfig = MISSING
    env: Any = MISSING
    dataset: DatasetConfig = MISSING
    reward: Any = MISSING
    server: Any = MISSING
    judge: Any = MISSING
    teacher: Any = MISSING
    tracking: TrackingConfig = MISSING
    runner: RunnerConfig = MISSING
    sweep: SweepConfig = MISSING
    serve: ServeConfig = MISSING
    trainer: Any = MISSING
    eval: EvalConfig = MISSING
    mode: str = MISSING
    group_size: int = MISSING
    total_steps: int = MISSING
    seed: int = MISSING
    distill_topk: int = MISSING
    judge_votes: int = MISSING
    output_root: str = MISSING
    output_dir: str = MISSING
    resume: bool = MISSING
    sinks: list[str] = MISSING

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
        if self.runner.workers > 1:
            # Each worker gets a share of every server's request slots; a worker without one would idle.
            _check(self.server.max_requests_in_flight >= self.runner.workers, "runner.workers",
                   f"<= server.max_requests_in_flight ({self.server.max_requests_in_flight}; each worker needs a request slot)", self.runner.workers)
        if self.trainer.kind == "local":
            _check(self.mode == "train", "trainer", "used with mode=train (trainer=local trains on the groups it writes)", f"trainer={self.trainer.kind}, mode={self.mode}")
            _check(self.teacher.kind != "none" or self.trainer.loss.get("pg", 0) > 0, "trainer.loss.pg",
                   "> 0 with teacher=none (only a teacher's rows feed the OPD terms)", self.trainer.loss.get("pg", 0))
        opd = getattr(self.env, "opd", None)
        if self.teacher.kind == "self_hint":
            _check(opd is not None, "teacher", "none or model with this env (teacher=self_hint needs the judge's hints: env=opd_coding)",
                   f"teacher=self_hint, env={getattr(self.env, 'name', '?')}")
        if opd is not None and opd.enabled and self.teacher.kind == "none":
            raise ConfigError("env.opd.enabled: true judges turns for hints, but teacher=none takes none; choose teacher=self_hint, "
                              "teacher=model teacher.hint=true, or env.opd.enabled=false", "env.opd.enabled")
        if self.teacher.kind == "model":
            _check(self.runner.workers == 1, "runner.workers", "1 with teacher=model (environment workers on Ray carry no teacher yet)", self.runner.workers)
            _check(not self.teacher.hint or opd is not None, "teacher.hint", "false with this env (only opd_coding judges turns for hints)", self.teacher.hint)


_SCHEMAS = {
    None: {"config_schema": Config},
    "model": {"model_schema": ModelConfig},
    "env": {"inline_math_schema": InlineMathEnvConfig, "opd_coding_schema": OPDCodingEnvConfig},
    "reward": {"inline_math_schema": InlineMathRewardConfig, "opd_coding_schema": OPDCodingRewardConfig},
    "server": {"local_schema": LocalServerConfig, "vllm_schema": RemoteServerConfig},
    "judge": {"policy_schema": JudgeConfig, "server_schema": JudgeServerConfig},
    "teacher": {"none_schema": TeacherConfig, "self_hint_schema": TeacherConfig, "model_schema": ModelTeacherConfig},
    "dataset": {"dataset_schema": DatasetConfig},
    "sandbox": {"sandbox_schema": SandboxConfig},
    "tracking": {"tracking_schema": TrackingConfig},
    "runner": {"runner_schema": RunnerConfig},
    "trainer": {"trainer_schema": TrainerConfig, "local_schema": LocalTrainerConfig},
}


def register() -> None:
    """Register the root schema and each group's schemas with Hydra's ConfigStore, and the
    `opd.run_dir` resolver that `output_dir` reads."""
    store = ConfigStore.instance()
    for group, schemas in _SCHEMAS.items():
        for name, node in schemas.items():
            store.store(group=group, name=name, node=node)
    OmegaConf.register_new_resolver("opd.run_dir", run_dir, replace=True)


def run_dir() -> str:
    """This run's directory: Hydra's, once the run has started; before that (`--cfg job --resolve`,
    `--help`) the directory a run started now would get (hydra.run.dir)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        raise ConfigError("output_dir: no Hydra run to take it from; pass output_dir=DIR", "output_dir")
    hydra = HydraConfig.get()
    started = OmegaConf.select(hydra, "runtime.output_dir")
    return str(started) if started else str(Path(str(hydra.run.dir)).absolute())


def compose(overrides: list[str] | None = None, hydra: bool = False) -> DictConfig:
    """The config tree composed as a launch would compose it (for code and tests outside a Hydra
    run); `output_dir` is a placeholder unless overridden. `hydra=True` keeps the `hydra` node."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=["output_dir=outputs/unused", *(overrides or [])], return_hydra_config=hydra)


_KNOB = re.compile(r"^\$\{(\w+)\}$")


def _knobs(tree: Any, prefix: str = "") -> dict[str, str]:
    """{nested key: top-level knob} for every value that is exactly `${knob}`."""
    found: dict[str, str] = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            found.update(_knobs(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(tree, str) and (match := _KNOB.match(tree)) and "." in prefix:
        found[prefix] = match.group(1)
    return found


def validate(cfg: DictConfig) -> Config:
    """Resolve the composed config and run every range check; raises ConfigError naming the key.

    An error about a value that came from a top-level knob (`env.opd.topk: ${distill_topk}`)
    names the knob the user typed."""
    from omegaconf.errors import MissingMandatoryValue

    raw = OmegaConf.to_container(cfg, resolve=False)
    try:
        typed = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as err:
        key = str(getattr(err, "full_key", "") or "?")
        raise ConfigError(f"{key} must be set: {_REQUIRED.get(key, f'{key}=VALUE')}", key) from None
    except ConfigError as err:
        knob = _knobs(raw).get(err.key or "")
        if knob is None:
            raise
        raise ConfigError(f"{str(err).replace(err.key or '', knob, 1)} (it sets {err.key})", knob) from None
    if not isinstance(typed, Config):
        raise ConfigError(f"the composed config is not the Config schema but {type(typed).__name__}")
    if isinstance(typed.env, dict):  # an environment of yours: its schemas come with its spec (opd.envs.registry)
        if not typed.env.get("spec"):
            raise ConfigError(f"env.name: environment {typed.env.get('name')!r} has no schema; an environment of yours names its "
                              "EnvSpec: env.spec=package.module:SPEC", "env.spec")
        spec = load_object(str(typed.env["spec"]), "env.spec")
        typed.env = _typed("env", getattr(spec, "env_schema", None), typed.env)
        if isinstance(typed.reward, dict):
            typed.reward = _typed("reward", getattr(spec, "reward_schema", None), typed.reward)
    # `+key=value` overrides bypass the schema at composition; to_object would drop them silently.
    known = set(_leaf_keys(OmegaConf.to_container(OmegaConf.structured(typed), resolve=False)))
    unknown = sorted(set(_leaf_keys(raw)) - known)
    if unknown:
        import difflib

        named = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
            named.append(f"{key} (did you mean {close[0]}?)" if close else key)
        raise ConfigError(f"unknown config key(s): {', '.join(named)}; not in the schema", unknown[0])
    return typed


def load_object(path: str, key: str) -> Any:
    """The object `package.module:attr` names (a config value naming code of yours); a ConfigError
    naming `key` when it cannot be imported."""
    import importlib

    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ConfigError(f"{key}: {path!r} is not package.module:attr", key)
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"{key}: cannot load {path!r}: {type(err).__name__}: {err}", key) from None


def _typed(key: str, schema: type | None, values: dict[str, Any]) -> Any:
    """`values` (an untyped config node) as `schema`'s dataclass, its checks run; a ConfigError
    naming the key for a missing schema, an unknown field or a wrong type."""
    from omegaconf.errors import OmegaConfBaseException

    if schema is None:
        raise ConfigError(f"{key}: env.spec declares no {key} schema for this untyped {key} config", key)
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), values))
    except OmegaConfBaseException as err:
        where = getattr(err, "full_key", "") or "?"
        raise ConfigError(f"{key}.{where}: {str(err).splitlines()[0]}", f"{key}.{where}") from None


# What to type for a value the config leaves to the user (`???` in conf/).
_REQUIRED = {
    "server.model": "server=vllm needs the model name its servers serve: server.model=NAME",
    "server.base_urls": "server=vllm needs its servers' addresses: server.base_urls=[http://host:8000/v1]",
    "judge.base_url": "judge=server needs its server's address: judge.base_url=http://host:8000/v1",
    "judge.model": "judge=server needs the model name its server serves: judge.model=NAME",
    "teacher.server.model": "teacher=model needs its model: teacher.server.model=DIR_OR_NAME (a base_url's served name, or one the run serves)",
}


def _leaf_keys(tree: Any, prefix: str = "") -> list[str]:
    if not isinstance(tree, dict) or not tree:
        return [prefix]
    keys: list[str] = []
    for key, value in tree.items():
        keys += _leaf_keys(value, f"{prefix}.{key}" if prefix else str(key))
    return keys
