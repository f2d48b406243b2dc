"""Our environments as atroposlib environments, for atroposlib's own `serve` and `process` commands.

An Atropos user runs them as any Atropos environment, with this project's defaults:

    python -m opd.atropos.inline_math serve --openai.base_url http://gpu-host:8000/v1 --openai.model_name Qwen/Qwen3-4B \
        --env.tokenizer_name Qwen/Qwen3-4B --env.opd_overrides '["model=qwen3"]'
    python -m opd.atropos.opd_coding process --env.total_steps 20 --env.data_path_to_save_groups data/coding.jsonl ...

`config_init` composes our config tree (conf/) for the environment with `env.opd_overrides` (any
Hydra overrides, e.g. `model=qwen3`) and gives atroposlib its values: the tokenizer, `group_size`,
`total_steps`, the context length, the trainer API's address and back-pressure, and one server
(`--openai.*`: address, model name, key, request slots). The environment built from them is ours
(`opd.build`), over our request pool, reading atroposlib's `--env.*`/`--openai.*` values back as
overrides; atroposlib drives it (its file writer, its trainer API client, its equal-score filter,
`ensure_scores_are_not_same`, which its `process` turns off). The loop is atroposlib's, with its
limits (`../shared/notes/atroposlib.md`); `python -m experiments.launch` runs ours. teacher=model
scores on a running teacher server (`teacher.server.base_url` in `env.opd_overrides`): nothing here
starts one.
"""

from __future__ import annotations

import json
import logging
import shlex
from typing import Any, ClassVar

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from pydantic import Field, field_validator

from opd import build
from opd.cli import fail, user_error
from opd.config import Config, ConfigError, compose, validate
from opd.serving.pool import ServerPool
from opd.teachers import ModelTeacher, teacher_of
from opd.tracking.traces import Tracer

logger = logging.getLogger(__name__)


class OPDAtroposConfig(BaseEnvConfig):
    """atroposlib's environment settings plus this project's own config as Hydra overrides."""

    opd_overrides: list[str] = Field(default_factory=list, description="Hydra overrides of this project's config (conf/): "
                                     "'[\"model=qwen3\", \"seed=1\"]' or 'model=qwen3 seed=1'")

    @field_validator("opd_overrides", mode="before")
    @classmethod
    def _overrides_from_the_command_line(cls, value: Any) -> Any:
        """atroposlib's command line hands a list field over as one string: a JSON list, or
        overrides separated by spaces (quoted as a shell would)."""
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError as err:
                raise ValueError(f"env.opd_overrides: {text!r} is not a JSON list of strings ({err.msg}); "
                                 "write '[\"model=qwen3\"]' or 'model=qwen3 seed=1'") from None
            if not isinstance(parsed, list) or not all(isinstance(item, str) for item in parsed):
                raise ValueError(f"env.opd_overrides: {text!r} must be a list of strings such as '[\"model=qwen3\"]'")
            return parsed
        return shlex.split(text)


class _NoServerMetrics:
    """atroposlib asks each server of its manager for wandb metrics; our pool keeps its own."""

    async def wandb_metrics(self, metrics: dict[str, Any], name: str) -> dict[str, Any]:
        return metrics


class AtroposPool(ServerPool):
    """Our request pool with what atroposlib's `BaseEnv` reads of its server manager."""

    @property
    def servers(self) -> list[_NoServerMetrics]:
        return [_NoServerMetrics() for _ in self.clients]

    async def update_weight(self, weight: float) -> None:
        """The trainer API's share for this environment: our pool schedules by free slots instead."""


def opd_config(env_name: str, overrides: list[str]) -> Config:
    """Our config for `env_name` with `overrides` (composed and validated as a launch would); an
    override that does not compose is a ConfigError naming `--env.opd_overrides` in one line."""
    try:
        composed = compose([f"env={env_name}", *overrides])
    except Exception as err:  # noqa: BLE001 - Hydra's errors for what was typed become one line; others are raised
        line = user_error(err, list(overrides))
        if line is None:
            raise
        raise ConfigError(f"--env.opd_overrides: {line}", "--env.opd_overrides") from None
    return validate(composed)


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class AtroposEntry:
    """Mixed in before one of our environment classes, with atroposlib's `BaseEnv` after it:
    `class X(AtroposEntry, OurEnv, BaseEnv)`, so that our methods take precedence over BaseEnv's
    (see the module docstring)."""

    opd_env: ClassVar[str]
    env_config_cls = OPDAtroposConfig
    # atroposlib builds a server manager from this class before ours replaces it; it gets no
    # servers, and a concrete class keeps it from guessing one from an empty list.
    server_cls = OpenAIServer

    @classmethod
    def cli(cls) -> None:
        """atroposlib's command line (`serve`, `process`, `evaluate`) in this project's error
        style: a value that is wrong, a tokenizer that cannot be had, servers that do not answer,
        each found before any work starts, stop the command with one line naming the option
        (`error: --env.tokenizer_name=...: ...`), exit status 2."""
        from pydantic import ValidationError

        try:
            super().cli()  # type: ignore[misc]
        except ConfigError as err:
            fail(str(err))
        except ValidationError as err:  # a value atroposlib's config refuses, e.g. --env.opd_overrides
            first = err.errors()[0]
            option = ".".join(str(part) for part in first.get("loc", ()))
            fail(f"--env.{option}: {first.get('msg', err)}" if option else str(err).splitlines()[0])

    @classmethod
    def preflight(cls, config: OPDAtroposConfig, servers: list[APIServerConfig]) -> Config:
        """Before anything is built, our config from atroposlib's values: the tokenizer found (a
        local directory, a cached hub model or one the hub gives now; an unreachable hub fails in
        seconds, not after transformers' retries), `--env.opd_overrides` composed and checked,
        every server answering and serving `--openai.model_name`, and the run's own checks
        (`opd.build.preflight`, the loss against the teacher's rows: opd.teachers). A ConfigError naming the option otherwise."""
        from opd.serving.model_lookup import find_model
        from opd.serving.watch import check_servers

        find_model(config.tokenizer_name, "--env.tokenizer_name")
        cfg = cls.opd_config_for(config, servers)
        for server in servers:
            check_servers([server.base_url], server.model_name, "--openai.base_url", "--openai.model_name")
        build.preflight(cfg, config.tokenizer_name)
        teacher_of(cfg).check_loss()  # teacher=model's own checks: `_teacher`, on its running server
        return cfg

    @classmethod
    def config_init(cls) -> tuple[OPDAtroposConfig, list[APIServerConfig]]:
        """atroposlib's defaults for this environment: ours."""
        cfg = opd_config(cls.opd_env, [])
        model = build.resolve_model(cfg.server.model)
        env_config = OPDAtroposConfig(
            tokenizer_name=model,
            group_size=cfg.group_size,
            total_steps=cfg.total_steps,
            max_token_length=cfg.server.max_model_len,
            rollout_server_url=cfg.serve.rollout_server_url,
            inference_weight=cfg.serve.weight,
            max_batches_offpolicy=cfg.serve.max_batches_offpolicy,
            # Groups (rollouts) in flight for one server's request slots.
            max_num_workers=build.groups_in_flight(cfg, 1),
            use_wandb=False,
            wandb_name=cls.opd_env,
            # atroposlib's default for inline_math (its `process` turns it off); opd_coding keeps
            # equal-score groups: their teacher rows are data whatever the scores.
            ensure_scores_are_not_same=cls.opd_env == "inline_math" and getattr(cfg.env, "drop_equal_scores", None) is not False,
            include_messages=cls.opd_env == "opd_coding",
        )
        server = APIServerConfig(base_url="http://localhost:8000/v1", model_name=model, api_key=cfg.server.api_key,
                                 num_max_requests_at_once=cfg.server.max_requests_in_flight, timeout=int(cfg.server.request_timeout_s))
        return env_config, [server]

    @classmethod
    def opd_config_for(cls, config: OPDAtroposConfig, server_configs: list[APIServerConfig]) -> Config:
        """Our config with atroposlib's values (`--env.*`, `--openai.*`) as overrides."""
        first = server_configs[0]
        urls = ",".join(_quoted(s.base_url) for s in server_configs)
        return opd_config(cls.opd_env, [
            "server=vllm", f"server.model={_quoted(first.model_name)}", f"server.base_urls=[{urls}]",
            f"server.max_model_len={config.max_token_length}", f"server.api_key={_quoted(first.api_key or 'x')}",
            f"server.max_requests_in_flight={first.num_max_requests_at_once}", f"server.request_timeout_s={float(first.timeout)}",
            f"group_size={config.group_size}", f"total_steps={config.total_steps}", *config.opd_overrides,
        ])

    def __init__(self, config: OPDAtroposConfig, server_configs: Any, slurm: bool = False, testing: bool = False) -> None:
        servers = server_configs if isinstance(server_configs, list) else [server_configs]
        cfg = self.preflight(config, servers)
        pool = AtroposPool([c for c in build.server_pool(cfg, cfg.server.model, cfg.server.base_urls).clients],
                           cfg.server.max_requests_in_flight, cfg.server.max_attempts)
        args, kwargs = build.environment_arguments(cfg, build.load_data(cfg), config.tokenizer_name, pool, Tracer.off(), build.judge_pool(cfg),
                                                   self._teacher(cfg, config.tokenizer_name))
        # atroposlib filters equal-score groups itself (`ensure_scores_are_not_same`).
        kwargs.pop("drop_equal_scores", None)
        # atroposlib's state (its config, tokenizer, loop bookkeeping), then ours over it: our
        # pool replaces its server manager, and its tokenizer is ours.
        BaseEnv.__init__(self, config, [], slurm=slurm, testing=testing)  # type: ignore[arg-type]
        super().__init__(*args, tokenizer=self.tokenizer, **kwargs)  # type: ignore[call-arg]
        self.opd_cfg = cfg
        self._metrics: dict[str, float] = {}
        logger.info("%s for atroposlib: %d server(s), model %s, overrides %s", self.opd_env, len(servers), cfg.server.model, config.opd_overrides)

    @staticmethod
    def _teacher(cfg: Config, tokenizer: str) -> Any:
        """teacher=model's scoring over its running server (checked against the student's
        tokenizer first); None where the kind needs no scorer. atroposlib's loop has no place to
        start and stop a server, so the teacher must be running (teacher.server.base_url); a kind
        of yours that needs a scorer is refused, naming teacher.kind (its groups would lack rows)."""
        kind = teacher_of(cfg)
        if not kind.needs_scorer:
            return None
        if not isinstance(kind, ModelTeacher):
            raise ConfigError(f"teacher.kind: under atroposlib's commands only teacher=model scores (on a running server); teacher={kind.name} "
                              f"needs a scorer they cannot serve: run it with python -m experiments.launch", "teacher.kind")
        if cfg.teacher.server.base_url is None:
            raise ConfigError("teacher.server.base_url: under atroposlib's commands teacher=model scores on a running server: "
                              "teacher.server.base_url=http://HOST:PORT/v1 (python -m experiments.launch also starts one itself)",
                              "teacher.server.base_url")
        teacher = ModelTeacher(cfg).check(tokenizer)
        return build.teacher_model(cfg, teacher, [cfg.teacher.server.base_url], Tracer.off())

    async def collect_trajectories(self, item: Any) -> tuple[Any, list]:
        group, backlog = await super().collect_trajectories(item)  # type: ignore[misc]
        self._metrics = self.group_metrics(group)  # type: ignore[attr-defined]
        return group, backlog

    async def wandb_log(self, wandb_metrics: dict | None = None) -> None:
        """atroposlib's wandb logging, with the last group's metrics (`reward/mean`, `opd/*`, ...)."""
        metrics, self._metrics = {**self._metrics, **(wandb_metrics or {})}, {}
        await super().wandb_log(metrics)  # type: ignore[misc]
