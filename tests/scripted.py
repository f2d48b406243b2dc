"""A scripted inference client for unit tests of logic that does not depend on the server: it
offers what `VLLMClient` offers (generate, score, chat) from Python callables, without HTTP, and
records what it was asked. Environments are built over it with the real `opd.build` code."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from opd.agent.chat_tokens import special_ids
from opd.serving.vllm_client import ChatReply, Generation, PromptScores


class ScriptedClient:
    def __init__(self, *, generate: Callable[..., Generation] | None = None, score: Callable[[list[int], int], PromptScores] | None = None,
                 chat: Callable[[list[dict[str, Any]], int], list[str]] | None = None, latency: float = 0.0, base_url: str = "http://scripted/v1") -> None:
        self.base_url = base_url
        self.request_errors = 0
        self.latency = latency
        self._generate, self._score, self._chat = generate, score, chat
        self.prompts: list[list[int]] = []  # generation prompts, in order
        self.seeds: list[int | None] = []  # their vLLM seeds (None: unseeded), in order
        self.scored: list[list[int]] = []  # scored prompts, in order
        self.chats: list[dict[str, Any]] = []  # chat requests, in order
        self.sampling: list[dict[str, Any]] = []  # each generation request's sampling fields
        self.running = self.most_running = self.served = 0

    async def _busy(self) -> None:
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.sleep(self.latency)
        finally:
            self.running -= 1
            self.served += 1

    async def generate(self, prompt_ids: list[int], *, max_tokens: int, temperature: float, stop: list[str] | None = None, n: int = 1,
                       seed: int | None = None, **sampling: Any) -> list[Generation]:
        self.prompts.append(list(prompt_ids))
        self.sampling.append({"temperature": temperature, **sampling})
        self.seeds.append(seed)
        await self._busy()
        assert self._generate is not None, "this scripted client does not generate"
        return [self._generate(prompt_ids, max_tokens=max_tokens, stop=stop) for _ in range(n)]

    async def score(self, prompt_ids: list[int], top_k: int, rows_from: int = 0) -> PromptScores:
        await self._busy()
        assert self._score is not None, "this scripted client does not score"
        result = self._score(list(prompt_ids), top_k)
        self.scored.append(list(prompt_ids))
        return result

    async def chat(self, messages: list[dict[str, Any]], *, n: int, max_tokens: int, temperature: float, **extra: Any) -> list[ChatReply]:
        """The script's answers: a text is a completion that stopped by itself; a ChatReply as given."""
        self.chats.append({"messages": messages, "n": n, "max_tokens": max_tokens, "temperature": temperature, **extra})
        await self._busy()
        assert self._chat is not None, "this scripted client does not chat"
        return [answer if isinstance(answer, ChatReply) else ChatReply(answer, "stop") for answer in self._chat(messages, n)]

    async def close(self) -> None:
        pass


def text_generator(tokenizer: Any, replies: list[tuple[str, str]], logprob: float = -0.25) -> Callable[..., Generation]:
    """Answers generation requests from a queue of (text, finish_reason), cut at max_tokens."""
    queue = list(replies)

    def generate(prompt_ids: list[int], *, max_tokens: int, stop: list[str] | None = None) -> Generation:
        text, finish = queue.pop(0)
        ids = tokenizer.encode(text, add_special_tokens=False)[:max_tokens]
        return Generation(ids, [logprob] * len(ids), finish)

    return generate


def vllm_like(tokenizer: Any, replies: list[str]) -> Callable[..., Generation]:
    """A scripted server answering in a real family's syntax, each reply tokenized by the real
    tokenizer, that stops as vLLM does: on a stop string as text (the ids up to the token that
    completes it, whatever the tokenisation), else on the end of the reply, adding the end-of-turn
    token unless the reply already ends with a special token (one the model stops on)."""
    queue = list(replies)
    specials = special_ids(tokenizer)

    def generate(prompt_ids: list[int], *, max_tokens: int, stop: list[str] | None = None) -> Generation:
        text = queue.pop(0)
        ids = tokenizer.encode(text, add_special_tokens=False)
        for marker in stop or []:
            at = text.find(marker)
            if at != -1:
                end = at + len(marker)
                cut = next(n for n in range(1, len(ids) + 1) if len(tokenizer.decode(ids[:n], skip_special_tokens=False)) >= end)
                return Generation(ids[:cut], [-0.5] * cut, "stop")
        if not ids or ids[-1] not in specials:
            ids = ids + [tokenizer.eos_token_id]
        return Generation(ids, [-0.5] * len(ids), "stop")

    return generate


def build_env(cfg: Any, data: Any, model: str, client: ScriptedClient, judge: ScriptedClient | None = None, slots: int = 8, max_attempts: int = 3,
              teacher: ScriptedClient | None = None) -> Any:
    """The configured environment over `client` (and `judge` for judge=server, `teacher` for
    teacher=model, in teacher.max_concurrent slots of its own), as opd.build makes it."""
    from opd import build
    from opd.distill.teacher_model import TeacherModel
    from opd.serving.pool import ServerPool
    from opd.tracking.traces import Tracer

    pool = ServerPool([client], slots, max_attempts, backoff_s=0.01)
    judge_pool = ServerPool([judge], slots, max_attempts, backoff_s=0.01) if judge is not None else None
    taught = None
    if teacher is not None:
        taught = TeacherModel(ServerPool([teacher], cfg.teacher.max_concurrent, max_attempts, backoff_s=0.01), cfg.teacher.server.model, cfg.teacher.topk)
    return build.environment(cfg, data, model, pool, Tracer.off(), judge_pool, taught)
