"""Turn the validated config into objects: the model, the dataset, the inference servers' pools,
the environment, the tracer and the sinks. The one place that knows every group; the servers'
lifecycles are opd.serving.lifecycle's, the teacher's wiring is its kind's (opd.teachers)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from opd.config import Config, ConfigError
from opd.data.sources import TaskSet
from opd.envs.base import RolloutEnv
from opd.serving.pool import ServerPool
from opd.sinks.base import Sink
from opd.tracking.mlflow_run import Tracker
from opd.tracking.traces import Tracer

logger = logging.getLogger(__name__)


# The project's own models by the name a config gives them, and their build presets (opd/fixture/build.py).
PROJECT_MODELS = {"fixture": "fixture", "fixture_teacher": "teacher", "fixture_student": "student"}


def resolve_model(name: str, key: str = "server.model") -> str:
    """"fixture" / "fixture_teacher" / "fixture_student" -> the project's fixture model / its teacher's / the teacher's student's directory
    (built if missing); else `name` once it is found: a local directory, a cached hub model, or
    one the hub gives now (else a `ConfigError` naming `key`, before any server starts)."""
    if name in PROJECT_MODELS:
        from opd.fixture.build import ensure_preset

        return str(ensure_preset(PROJECT_MODELS[name]))
    from opd.serving.model_lookup import find_model

    return find_model(name, key)


def vocabulary_size(model: str) -> int | None:
    """The model's vocabulary (config.json's vocab_size) when `model` is a local directory."""
    import json

    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size) if isinstance(size, int) else None


def preflight(cfg: Config, model: str) -> None:
    """What can be checked before any server starts or any request is sent: the reward's weights
    against its rubric's signals, the sinks (opd.sinks.registry.check_sinks), trainer.loss against the loss terms (the teacher rows they need: the teacher's own preflight, opd.teachers), top-K against the model's vocabulary, and running servers (server=vllm, judge=server) answering and serving the
    model. Each failure is a ConfigError naming the key."""
    from opd.rewards.rubric import RubricError
    from opd.serving.watch import check_servers

    try:  # a weight without a signal (or the reverse) fails here, not after vLLM's start-up
        environment_class(cfg).build_rubric(cfg.reward)
    except RubricError as err:
        raise ConfigError(str(err), err.key) from None
    from opd.sinks.registry import check_sinks

    check_sinks(cfg)  # an unknown sink, one of yours that does not import, one the run needs left out, a bad setting
    if cfg.trainer.kind == "local":
        from opd.train.losses import LOSS_TERMS

        for name in cfg.trainer.loss:  # a mistyped term fails here, naming the nearest one
            LOSS_TERMS.get(name)
    vocab = vocabulary_size(model)
    if vocab is not None:
        for key, value in (("distill_topk", cfg.distill_topk), ("server.max_logprobs", cfg.server.max_logprobs)):
            if value > vocab:
                raise ConfigError(f"{key} must be <= the model's vocabulary ({vocab} tokens, {model}), got {value}", key)
    if cfg.server.kind == "vllm":
        check_servers(list(cfg.server.base_urls), model, "server.base_urls", "server.model")
    if cfg.judge.kind == "server":
        if cfg.judge.tokenizer is not None:  # the judge's own tokenizer: what its quoted text is defused for
            from opd.serving.model_lookup import find_model

            find_model(cfg.judge.tokenizer, "judge.tokenizer")
        check_servers([cfg.judge.base_url], cfg.judge.model, "judge.base_url", "judge.model")


def load_data(cfg: Config) -> TaskSet:
    """The environment's dataset (loaded before any server starts, so bad paths fail first)."""
    from opd.envs.registry import spec_of

    data = spec_of(cfg.env).load_data(cfg)
    logger.info("dataset %s: %d train, %d eval items", data.source, len(data.train), len(data.eval))
    return data


def teacher_pool(cfg: Config, teacher: str, urls: list[str]) -> ServerPool:
    """The teacher's servers: `teacher.max_concurrent` slots over `urls`, apart from the policy's."""
    from opd.serving.vllm_client import VLLMClient

    served = cfg.teacher.server.model if cfg.teacher.server.base_url is not None and cfg.teacher.server.model not in PROJECT_MODELS else teacher
    clients = [VLLMClient(url, served, cfg.teacher.server.api_key, cfg.server.request_timeout_s, cfg.teacher.server.keepalive_s) for url in urls]
    return ServerPool(clients, cfg.teacher.max_concurrent, cfg.server.max_attempts)


def teacher_model(cfg: Config, teacher: str, urls: list[str], tracer: Tracer) -> Any:
    """teacher=model's scoring over its own pool (`teacher_pool`)."""
    from opd.distill.teacher_model import TeacherModel

    return TeacherModel(teacher_pool(cfg, teacher, urls), cfg.teacher.server.model, cfg.teacher.topk, tracer)


def server_pool(cfg: Config, model: str, base_urls: list[str]) -> ServerPool:
    """The policy's servers: `server.max_requests_in_flight` slots each, `server.max_attempts` tries."""
    from opd.serving.vllm_client import VLLMClient

    clients = [VLLMClient(url, model, cfg.server.api_key, cfg.server.request_timeout_s, cfg.server.keepalive_s) for url in base_urls]
    return ServerPool(clients, cfg.server.max_requests_in_flight, cfg.server.max_attempts)


def judge_pool(cfg: Config) -> ServerPool | None:
    """judge=server's own server (None: the judge uses the policy's pool)."""
    if cfg.judge.kind != "server":
        return None
    from opd.serving.vllm_client import VLLMClient

    client = VLLMClient(cfg.judge.base_url, cfg.judge.model, cfg.judge.api_key, cfg.server.request_timeout_s, cfg.judge.keepalive_s)
    return ServerPool([client], cfg.server.max_requests_in_flight, cfg.server.max_attempts)


def groups_in_flight(cfg: Config, servers: int) -> int:
    """runner.groups_in_flight, or (null) enough groups to keep every server request slot busy."""
    from opd.runner import groups_to_fill

    if cfg.runner.groups_in_flight is not None:
        return cfg.runner.groups_in_flight
    return groups_to_fill(cfg.server.max_requests_in_flight * servers, cfg.group_size, cfg.runner.oversubscribe)


def tracer(cfg: Config, tracker: Tracker | None) -> Tracer:
    """MLflow traces when tracking.traces is on and the run is small enough; else a no-op tracer."""
    if tracker is None or not cfg.tracking.traces:
        return Tracer.off()
    rollouts = cfg.total_steps * cfg.group_size
    if cfg.mode == "evaluate":
        logger.warning("tracking.traces: evaluation rollouts are not traced (only train/serve)")
        return Tracer.off()
    if rollouts > cfg.tracking.traces_max_rollouts:
        logger.warning("tracking.traces: off, this run makes %d rollouts > tracking.traces_max_rollouts=%d", rollouts, cfg.tracking.traces_max_rollouts)
        return Tracer.off()
    return Tracer(True, tracker.for_traces())


def environment_arguments(cfg: Config, data: TaskSet, model: str, pool: ServerPool, tracer: Tracer, judge: ServerPool | None = None,
                          teacher: Any = None, untaught: bool = False) -> tuple[tuple, dict[str, Any]]:
    """The configured environment's constructor arguments (args, kwargs), over `pool` (and
    `judge`, judge=server's own pool; `teacher`, the teacher kind's scorer (teacher=model's `TeacherModel`); `untaught`: built
    without it on purpose, as the teacher's own policy is)."""
    from opd.agent.chat_format import ChatFormat
    from opd.envs.registry import spec_of

    common = {"data": data, "pool": pool, "tokenizer_path": model, "group_size": cfg.group_size,
              "max_model_len": cfg.server.max_model_len, "seed": cfg.seed, "tracer": tracer, "chat_format": ChatFormat.from_config(cfg.model)}
    if teacher is not None:  # its groups are labelled with the kind's registered name (opd.teachers)
        common["teacher"], common["teacher_kind"] = teacher, cfg.teacher.kind
    elif cfg.teacher.kind == "model" and not untaught:  # never records that quietly lack the teacher's rows
        raise ConfigError("teacher: teacher=model runs through python -m experiments.launch (opd.experiment serves and checks the teacher) "
                          "or atroposlib's commands with teacher.server.base_url; "
                          "this entry point does not carry one", "teacher")
    return spec_of(cfg.env).constructor_arguments(cfg, common, judge)


def environment_class(cfg: Config) -> type[RolloutEnv]:
    """The configured environment's class (opd.envs.registry)."""
    from opd.envs.registry import spec_of

    return spec_of(cfg.env).environment_class()


def environment(cfg: Config, data: TaskSet, model: str, pool: ServerPool, tracer: Tracer, judge: ServerPool | None = None, teacher: Any = None,
                untaught: bool = False) -> RolloutEnv:
    """The configured environment over `pool` (and `judge`, judge=server's own pool; `teacher`,
    teacher=model's scoring; `untaught`, see `environment_arguments`)."""
    args, kwargs = environment_arguments(cfg, data, model, pool, tracer, judge, teacher, untaught)
    return environment_class(cfg)(*args, **kwargs)


def evaluator(cfg: Config, env: RolloutEnv, concurrency: int, tracker: Tracker | None) -> Any:
    """Evaluation of the held-out split (mode=evaluate runs it alone)."""
    from opd.sinks.evaluation import Evaluator

    return Evaluator(env, cfg.eval, concurrency, Path(cfg.output_dir), tracker)


def sinks(cfg: Config, env: RolloutEnv, model: str, base_urls: list[str], tracker: Tracker | None, concurrency: int,
          ceiling: Any = None) -> list[Sink]:
    """Where groups go, in order: the JSONL file, then each sink `cfg.sinks` names that the run
    uses (opd.sinks.registry); `ceiling`: the teacher's side of the evaluation (`teacher_ceiling`)."""
    from opd.sinks.registry import SinkContext, build_sinks

    return build_sinks(list(cfg.sinks), SinkContext(cfg, env, model, base_urls, tracker, concurrency, Path(cfg.output_dir), ceiling))
