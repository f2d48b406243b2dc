"""What every environment shares: the skeleton of a run around each environment's algorithm, over
our server pool, with atroposlib's `ScoredDataGroup` as the group it makes.

The base owns the group: the item order (a seeded shuffle of the train split, epoch after epoch),
`group_size` rollouts of an item at once (one trace root and latency ledger each), the teacher's
rows on every rollout whenever the run's teacher kind gives a scorer (teacher=model, or a kind of
yours: the group is labelled with the kind's name), the group record, the per-group
metrics every env has, and the evaluation (one rollout per held-out item). A subclass implements
one method, `rollout(item, temperature, prepared)`: one scored rollout as a `RolloutResult`
(failing at class definition without it), and may add:
- `prepare(item, training)`: what every rollout of a group shares (inline_math: its prompt);
- `finish_group(group, item, results, roots, rows)`: its own stage on the whole group (opd_coding:
  the judge's hints; inline_math: the dynamic few-shot pool);
- `env_metrics(group)`: its own per-group metrics; `item_fields`: item keys the record keeps;
  `budget_fields`: env.* fields the record keeps (its budgets); `tool_schemas`: its tools' schemas,
  for the start-up check of the model's chat format and for the turn parser (`self.parser`), which
  loads on a thread while the first requests go out.
The runner (`opd.runner`) drives it, not atroposlib's `process_manager` (which has no error
isolation and can loop forever), and checks every group once before it is written. The methods
keep atroposlib's `BaseEnv` names and signatures, so `opd.atropos` runs the same classes under
atroposlib's own commands by adding `BaseEnv` below them; importing atroposlib's `BaseEnv` costs
seconds (transformers, torch, wandb), so a run of ours never does.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import random
import statistics
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

from opd import latency
from opd.agent.chat_format import BackgroundParser, ChatFormat, TurnParser, check
from opd.config import EnvConfig
from opd.data.sources import TaskSet
from opd.distill.teacher import TeacherRows
from opd.distill.teacher_model import TeacherModel, sequence_fields, teacher_metrics
from opd.records import MASK, Sequence
from opd.serving.pool import RequestCounts, ServerPool
from opd.serving.tokenizer import load_tokenizer
from opd.serving.vllm_client import Generation
from opd.serving.weights import ServedWeights
from opd.tracking.traces import Tracer

if TYPE_CHECKING:
    from atroposlib.envs.base import ScoredDataGroup
    from opd.rewards.rubric import Rubric, Scored

logger = logging.getLogger(__name__)

# How long closing an environment waits for its turn parser's thread to finish loading.
PARSER_JOIN_S = 120.0

# The vLLM seeds of the current rollout's generation requests, in order (None: unseeded). Set per
# rollout by `evaluate`; a context variable, so concurrent rollouts each read their own.
_REQUEST_SEEDS: ContextVar[Iterator[int] | None] = ContextVar("opd_request_seeds", default=None)


def request_seeds(*parts: Any) -> Iterator[int]:
    """Seeds in [0, 2**31) for one rollout's requests, one after another, derived from `parts`
    (e.g. the evaluation seed, the item id and the sample index) and the request's position: the
    same parts give the same seeds in every process and run."""
    for n in itertools.count():
        digest = hashlib.blake2b(repr((*parts, n)).encode(), digest_size=8).digest()
        yield int.from_bytes(digest, "big") % 2**31


@dataclass
class ItemResult:
    """One rollout of a held-out item: correct or not, its reward, per-item values averaged as
    `eval/<name>`, and what the samples table shows."""

    correct: bool
    score: float
    metrics: dict[str, float] = field(default_factory=dict)
    prompt: str = ""
    response: str = ""
    turns: int = 1


@dataclass
class RolloutResult:
    """One finished, scored rollout as an env's `rollout` returns it; the base makes the group's
    record (`overrides[i]`, the viewer's fields) and an evaluation's `ItemResult` from it."""

    # Its aligned token record (prompt masked, sampled ids with their logprobs, inserted text masked).
    sequence: Sequence
    # The rubric's score: the total is the rollout's score, the signals are recorded. Whether the
    # rollout passed is the rubric's pass rule on these signals, decided once by the base (`passed`).
    scored: Scored
    # How it ended (eos, length, context, ...).
    finish: str
    # Calls that reached a tool, and calls whose result is an error.
    tool_calls: int = 0
    tool_errors: int = 0
    # Sampled tokens (None: the sequence's unmasked ones).
    generated_tokens: int | None = None
    # The conversation as the chat template takes it (the record's `messages`; None: not recorded).
    messages: list[dict[str, Any]] | None = None
    # The env's own per-rollout fields of the record.
    fields: dict[str, Any] = field(default_factory=dict)
    # What an evaluation shows and averages (`ItemResult`).
    prompt: str = ""
    response: str = ""
    turns: int = 1
    eval_metrics: dict[str, float] = field(default_factory=dict)
    # The env's own record of the rollout, for its `finish_group` (not written).
    state: Any = None

    def detail(self, passed: bool) -> dict[str, Any]:
        """Its `overrides[i]` in the group record, with whether it `passed` (the rubric's verdict)."""
        generated = self.generated_tokens if self.generated_tokens is not None else sum(m != MASK for m in self.sequence.masks)
        return {"reward_signals": self.scored.signals, "passed": passed, "tool_calls": self.tool_calls, "tool_errors": self.tool_errors,
                "finish": self.finish, "generated_tokens": generated, **self.fields}


@dataclass
class EvalReport:
    """One evaluation: `eval/*` metrics, one row per item, and the greedy rollouts as a table."""

    metrics: dict[str, float]
    items: list[dict[str, Any]]
    samples: list[dict[str, Any]]


class RolloutEnv:
    """An environment over a `ServerPool`; see the module docstring."""

    # reward config -> the rubric that owns the whole score (signals, weights, penalty, clamp, pass rule).
    build_rubric: Callable[[Any], Rubric[Any]]
    # Keys of an item the group record keeps in `group_overrides` (inline_math: its answer).
    item_fields: tuple[str, ...] = ()
    # Fields of env.* every group records in `generation_params`: its budgets (inline_math: max_new_tokens).
    budget_fields: tuple[str, ...] = ()
    # The schemas of the tools the model is shown (opd.tools.registry.schemas; none: a plain chat).
    tool_schemas: tuple[dict[str, Any], ...] | list[dict[str, Any]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.rollout is RolloutEnv.rollout:
            raise TypeError(f"{cls.__name__}: an environment implements `async def rollout(self, item, temperature, prepared) -> RolloutResult`")

    def __init__(self, cfg: EnvConfig, reward: Any, *, data: TaskSet, pool: ServerPool, tokenizer_path: str, group_size: int, max_model_len: int,
                 seed: int, tracer: Tracer, chat_format: ChatFormat, drop_equal_scores: bool = False, tokenizer: Any = None,
                 served_weights: ServedWeights | None = None, teacher: TeacherModel | None = None, teacher_kind: str = "model") -> None:
        # env.* (an opd.config.EnvConfig) and the rubric of reward.*, which owns the whole score.
        self.cfg = cfg
        self.rubric = self.build_rubric(reward)
        # Requests go through our pool (slots, retries). `tokenizer`: one already loaded (atroposlib's).
        self.server = pool
        # The teacher kind's scorer (teacher=model's, or a kind of yours): scores every sampled token of
        # every rollout over its own pool (None: no teacher scores them). `teacher_kind`: that kind's
        # registered name (`teacher.kind`), the groups' `group_overrides.teacher`.
        self.teacher, self.teacher_kind = teacher, teacher_kind
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(tokenizer_path)
        self.data = data
        self.group_size = group_size
        self.max_model_len = max_model_len
        self.tracer = tracer
        # `sampling`: top_p / top_k / min_p sent with every generation (absent ones: the model's defaults).
        self.temperature, self.sampling, self.eval_temperature = cfg.temperature, dict(cfg.sampling), cfg.eval_temperature
        self.drop_equal_scores = drop_equal_scores
        # The env's budgets every group records in `generation_params` (e.g. max_new_tokens).
        self.record_params = {name: getattr(cfg, name) for name in self.budget_fields}
        self.rng = random.Random(seed)
        # The model's format; the start-up check stops here, naming what is missing, when the
        # tokenizer or the chat template cannot carry it.
        self.chat_format = chat_format
        tools = list(self.tool_schemas)
        check(chat_format, self.tokenizer, tools, tokenizer_path)
        # vLLM's parsers of the format, loaded off the start-up path (see BackgroundParser).
        self.parser = BackgroundParser(lambda: TurnParser(chat_format, self.tokenizer, tools))
        self._order: list[int] = []
        # The version of the weights the servers serve (a trainer in the run raises it; one object
        # owns it): every group records the version it was generated with (`group_overrides.weight_version`).
        self.served_weights = served_weights if served_weights is not None else ServedWeights()

    def request_pools(self) -> list[Any]:
        """The pools of its inference servers: the policy's and teacher=model's."""
        return [self.server, *([self.teacher.pool] if self.teacher is not None else [])]

    def request_counts(self) -> RequestCounts:
        """What happened to its requests so far, over `request_pools` (opd.serving.pool.RequestCounts)."""
        return sum((pool.counts for pool in self.request_pools()), RequestCounts())

    @property
    def request_errors(self) -> int:
        """Requests to the inference servers that failed for good so far (after their retries)."""
        return self.request_counts().failed

    async def teach(self, sequence: Any) -> TeacherRows | None:
        """The teacher's rows on every sampled token of one finished rollout (None: no scorer); a
        failure after the teacher pool's retries fails the group."""
        if self.teacher is None:
            return None
        with latency.phase("opd"):
            return await self.teacher.score_sequence(sequence.tokens, sequence.masks)

    def add_teacher_rows(self, group: dict[str, Any], rows: list[TeacherRows]) -> None:
        """Put the teacher's rows in the group's OPD fields and mark the group as taught on every
        trained token by its kind (`group_overrides.teacher`: the kind's name, which the record
        rules hold to a row on every trained token) and model (`teacher_model`)."""
        assert self.teacher is not None
        fields = sequence_fields(rows)
        group["distill_token_ids"], group["distill_logprobs"] = fields["distill_token_ids"], fields["distill_logprobs"]
        for detail, lps in zip(group["overrides"], fields["teacher_logprobs"]):
            detail["teacher_logprobs"] = lps
        group["group_overrides"].update(teacher=self.teacher_kind, teacher_model=self.teacher.model)

    async def setup(self) -> None:
        """Fail before generating if teacher=model's server cannot return its top-K rows (data is
        loaded before the env is built, opd.build)."""
        if self.teacher is None:
            return
        from opd.config import ConfigError
        from opd.serving.vllm_client import ServerRequestError

        probe = self.tokenizer.encode("hello world", add_special_tokens=False)
        try:
            await self.teacher.score(probe, self.teacher.top_k)
        except ServerRequestError as err:
            if err.status == 400:
                raise ConfigError(f"teacher.topk={self.teacher.top_k} (distill_topk) is refused by the teacher's server (above its "
                                  f"--max-logprobs?): {err}", "teacher.topk") from None
            raise

    async def ready(self) -> None:
        """Wait for what the env sets up in the background (the turn parser, and what `setup`
        starts), raising what failed there: a benchmark's timing then measures no set-up."""
        await self.parser.get()

    async def get_next_item(self) -> dict[str, Any]:
        """The next training item: a seeded shuffle of the train split, epoch after epoch."""
        if not self._order:
            self._order = list(range(len(self.data.train)))
            self.rng.shuffle(self._order)
        return self.data.train[self._order.pop()]

    # ---- one group --------------------------------------------------------------------------

    async def collect_trajectories(self, item: dict[str, Any]) -> tuple[ScoredDataGroup, list]:
        """`group_size` rollouts of `item` (one trace per rollout when tracing is on)."""
        inputs = {k: v for k, v in item.items() if isinstance(v, (str, int, float)) and k not in ("solution", "test_code")}
        roots = [self.tracer.start_root("rollout", {**inputs, "index": i}) for i in range(self.group_size)]
        version = self.served_weights.version
        try:
            group = await self.make_group(item, roots)
            group["group_overrides"]["weight_version"] = version
            with latency.phase("parser_load"):
                await self.parser.get()  # no group before the parser names are checked (a ConfigError ends the run)
        except BaseException as err:
            for root in roots:
                self.tracer.end_root(root, error=err)
            raise
        for root, score, detail in zip(roots, group["scores"], group["overrides"]):
            self.tracer.end_root(root, {"score": score, **detail.get("reward_signals", {})})
        return group, []

    async def make_group(self, item: dict[str, Any], roots: list[Any]) -> ScoredDataGroup:
        """One rollout per trace root, all at once; each taught by teacher=model (when the run has
        one) as soon as it ends, in the teacher's own slots; then the record and the env's stage."""
        prepared = self.prepare(item, training=True)

        async def one(root: Any) -> tuple[RolloutResult, TeacherRows | None]:
            with self.tracer.attach(root), latency.rollout():
                result = await self.rollout(item, self.temperature, prepared)
                return result, await self.teach(result.sequence)

        done = await asyncio.gather(*(one(root) for root in roots))
        results = [result for result, _ in done]
        rows = [r for _, r in done if r is not None] if self.teacher is not None else None
        messages = [r.messages or [] for r in results] if any(r.messages is not None for r in results) else None
        group = self.group_record(item, [r.sequence for r in results], [r.scored.total for r in results], [r.detail(self.passed(r)) for r in results],
                                  self.record_params, messages, {key: item[key] for key in self.item_fields})
        if rows is not None:
            self.add_teacher_rows(group, rows)
        await self.finish_group(group, item, results, roots, rows)
        return group

    def passed(self, result: RolloutResult) -> bool:
        """Whether a rollout solved its task: its rubric's pass rule on its signals, the one
        verdict the record (`overrides[i].passed`), the metrics (`accuracy`, an evaluation's
        `correct`) and the viewer read."""
        return self.rubric.passed(result.scored.signals)

    def prepare(self, item: dict[str, Any], training: bool) -> Any:
        """What every rollout of `item` shares (given to `rollout` as `prepared`): once per group
        (`training`), once per evaluated rollout; None unless an env needs it."""
        return None

    async def rollout(self, item: dict[str, Any], temperature: float, prepared: Any) -> RolloutResult:
        """One rollout of `item` at `temperature`, scored (every environment's own)."""
        raise NotImplementedError

    async def finish_group(self, group: ScoredDataGroup, item: dict[str, Any], results: list[RolloutResult], roots: list[Any],
                           rows: list[TeacherRows] | None) -> None:
        """The env's own stage on a recorded group (`rows`: the teacher scorer's, None without one)."""

    def drop_reason(self, group: dict[str, Any]) -> str | None:
        """Why the runner should not write `group` (None: write it): with `drop_equal_scores`, a
        group of more than one rollout whose scores are all equal, as atroposlib's
        `ensure_scores_are_not_same` drops it."""
        scores = group["scores"]
        if self.drop_equal_scores and len(scores) > 1 and len(set(scores)) == 1:
            return "equal scores"
        return None

    def group_record(self, item: dict[str, Any], sequences: list[Any], scores: list[float], details: list[dict[str, Any]],
                     generation_params: dict[str, Any], messages: list[list[dict[str, Any]]] | None = None,
                     group_overrides: dict[str, Any] | None = None) -> ScoredDataGroup:
        """The group as written: tokens, masks, logprobs of each `Sequence`, scores, details
        (each rollout's `passed`: did it solve its task, `tool_calls`: calls that reached a tool,
        as the viewer shows them)."""
        return dict(  # type: ignore[return-value]  # a ScoredDataGroup
            tokens=[s.tokens for s in sequences],
            masks=[s.masks for s in sequences],
            scores=scores,
            inference_logprobs=[s.logprobs for s in sequences],
            advantages=None,
            ref_logprobs=None,
            messages=messages,
            # max_model_len: the run's context, which no sequence passes (a record rule checks it).
            generation_params={"temperature": self.temperature, **self.sampling, "max_model_len": self.max_model_len, **generation_params},
            # Which environment wrote the group: readers (the viewer) go by it, not by the record's shape.
            group_overrides={"env": self.name, "item_id": item["id"], **(group_overrides or {})},
            overrides=details,
        )

    async def generate(self, prompt_ids: list[int], *, max_tokens: int, temperature: float, stop: list[str] | None = None) -> Generation:
        """Sample one continuation of `prompt_ids` at `temperature` with the env's other sampling
        fields (a model-call span when tracing); seeded when the rollout has request seeds."""
        seeds = _REQUEST_SEEDS.get()
        seeded = {"seed": next(seeds)} if seeds is not None else {}
        with self.tracer.span("generate", "LLM", {"prompt_tokens": len(prompt_ids), "max_tokens": max_tokens, "temperature": temperature, "stop": stop, **seeded}) as span:
            (gen,) = await self.server.generate(prompt_ids, max_tokens=max_tokens, temperature=temperature, stop=stop, **self.sampling, **seeded)
            if span.active:
                span.outputs({"text": self.tokenizer.decode(gen.token_ids), "tokens": len(gen.token_ids), "finish_reason": gen.finish_reason})
        return gen

    # ---- metrics ----------------------------------------------------------------------------

    def group_metrics(self, group: dict[str, Any]) -> dict[str, float]:
        """Per-group metrics logged after the group is written (keys are MLflow metric names):
        what every env records (scores, raw reward signals, tool errors, tokens), then the env's own."""
        details = group["overrides"]
        n = len(details)
        metrics = {
            "reward/mean": statistics.fmean(group["scores"]),
            "reward/std": statistics.pstdev(group["scores"]),
            "tool_errors/mean": sum(d["tool_errors"] for d in details) / n,
            "tokens/generated_mean": sum(d["generated_tokens"] for d in details) / n,
            "tokens/sequence_mean": sum(len(t) for t in group["tokens"]) / n,
            "accuracy": sum(bool(d["passed"]) for d in details) / n,
        }
        for name in details[0]["reward_signals"]:
            metrics[f"reward/{name}"] = sum(d["reward_signals"][name] for d in details) / n
        if group["group_overrides"].get("teacher") is not None:  # a scorer's rows on every trained token
            metrics.update(teacher_metrics(group))
        return {**metrics, **self.env_metrics(group)}

    def env_metrics(self, group: dict[str, Any]) -> dict[str, float]:
        return {}

    # ---- evaluation -------------------------------------------------------------------------

    async def evaluate(self, *args: Any, concurrency: int = 8, samples_per_item: int = 0, sample_temperature: float = 1.0,
                       max_items: int | None = None, seed: int | None = None, **kwargs: Any) -> EvalReport:
        """One greedy rollout per held-out item (at `eval_temperature`) and `samples_per_item`
        sampled ones (at `sample_temperature`), `concurrency` rollouts at a time. With `seed`, each
        request of a rollout carries a vLLM seed derived from (seed, item id, sample index, request
        number), so evaluations of the same weights draw the same random stream. Failed rollouts
        are counted (`eval/failed_rollouts`), not hidden; an item whose greedy rollout failed is
        left out of the greedy metrics."""
        items = self.data.eval[:max_items] if max_items else self.data.eval
        semaphore = asyncio.Semaphore(concurrency)
        failed = 0

        async def one(item: dict[str, Any], temperature: float, sample: int | str) -> ItemResult | None:
            nonlocal failed
            if seed is not None:  # this task's own context: concurrent rollouts keep their streams apart
                _REQUEST_SEEDS.set(request_seeds(seed, item.get("id"), sample))
            async with semaphore:
                try:
                    return await self.eval_item(item, temperature)
                except Exception as err:
                    failed += 1
                    logger.warning("eval item %s failed: %s: %s", item.get("id"), type(err).__name__, err)
                    return None

        runs = [[one(item, self.eval_temperature, "greedy"), *(one(item, sample_temperature, i) for i in range(samples_per_item))] for item in items]
        results = await asyncio.gather(*(asyncio.gather(*calls) for calls in runs))
        await self.parser.get()  # the parser names are checked (see collect_trajectories)
        report = _report(items, results, samples_per_item)
        report.metrics["eval/failed_rollouts"] = float(failed)
        return report

    async def eval_item(self, item: dict[str, Any], temperature: float) -> ItemResult:
        """One rollout of a held-out item (no teacher rows, no env stage). A sampled one (temperature
        above 0) of a run with a teacher model also gets its per-token reverse KL to the teacher
        (`reverse_kl_to_teacher`, averaged as `eval/sampled_reverse_kl_to_teacher`): what OPD
        minimises, on the same seeded held-out samples at every evaluation, so a fall over a run is
        the student's and not the training items'."""
        r = await self.rollout(item, temperature, self.prepare(item, training=False))
        metrics = dict(r.eval_metrics)
        if self.teacher is not None and temperature > 0:
            metrics["reverse_kl_to_teacher"] = await self._reverse_kl_to_teacher(r.sequence)
        return ItemResult(self.passed(r), r.scored.total, metrics, prompt=r.prompt, response=r.response, turns=r.turns)

    async def _reverse_kl_to_teacher(self, sequence: Sequence) -> float:
        """The mean of student_lp - teacher_lp over the sampled tokens (the k1 estimate of
        KL(student || teacher), unbiased since the student sampled them; `teacher/reverse_kl`'s)."""
        assert self.teacher is not None
        rows = await self.teacher.score_sequence(sequence.tokens, sequence.masks)
        diffs = [s - t for s, t, m in zip(sequence.logprobs, rows.sampled_logprobs, sequence.masks) if m != MASK and t is not None]
        if not diffs:
            raise ValueError("the teacher scored none of the rollout's sampled tokens")
        return statistics.fmean(diffs)

    async def close(self) -> None:
        await self.server.close()
        if self.teacher is not None:
            await self.teacher.close()
        await asyncio.to_thread(self.parser.join, PARSER_JOIN_S)


def _report(items: list[dict[str, Any]], results: list[list[ItemResult | None]], samples_per_item: int) -> EvalReport:
    """Greedy and sampled accuracy overall and per kind of item, per-item rows, the samples table."""
    rows, table = [], []
    greedy = [r[0] for r in results if r[0] is not None]
    sampled = [s for r in results for s in r[1:] if s is not None]
    n = max(1, len(greedy))
    metrics = {
        "eval/accuracy": sum(r.correct for r in greedy) / n,
        "eval/reward_mean": statistics.fmean([r.score for r in greedy]) if greedy else 0.0,
        "eval/items": float(len(items)),
        "eval/failed_items": float(len(items) - len(greedy)),
    }
    for name in greedy[0].metrics if greedy else []:
        metrics[f"eval/{name}"] = sum(r.metrics[name] for r in greedy) / n
    if samples_per_item:
        metrics["eval/sampled_accuracy"] = sum(s.correct for s in sampled) / max(1, len(sampled))
        metrics["eval/sampled_reward_mean"] = statistics.fmean([s.score for s in sampled]) if sampled else 0.0
        for name in sampled[0].metrics if sampled else []:
            metrics[f"eval/sampled_{name}"] = sum(s.metrics[name] for s in sampled) / len(sampled)
    by_kind: dict[str, list[tuple[ItemResult | None, list[ItemResult]]]] = {}
    for item, (first, *rest) in zip(items, results):
        done = [s for s in rest if s is not None]
        row = {"item_id": item.get("id"), "kind": item.get("kind"), "greedy_correct": None if first is None else first.correct,
               "greedy_reward": None if first is None else first.score, "samples": len(done),
               "sampled_correct": sum(s.correct for s in done), "sampled_reward_mean": statistics.fmean([s.score for s in done]) if done else None}
        for name in done[0].metrics if done else []:  # the samples' own means (the reverse KL to the teacher), for per-item intervals
            row[f"sampled_{name}"] = statistics.fmean([s.metrics[name] for s in done])
        rows.append(row)
        if first is not None:
            table.append({"item_id": item.get("id"), "kind": item.get("kind"), "prompt": first.prompt, "response": first.response,
                          "reward": first.score, "correct": first.correct, "turns": first.turns})
        if item.get("kind"):
            by_kind.setdefault(str(item["kind"]), []).append((first, done))
    for kind, entries in sorted(by_kind.items()):
        firsts = [f for f, _ in entries if f is not None]
        metrics[f"eval/accuracy/{kind}"] = sum(f.correct for f in firsts) / max(1, len(firsts))
        for name in firsts[0].metrics if firsts else []:  # the env's own rates (format violations, tool use) per kind too
            metrics[f"eval/{name}/{kind}"] = sum(f.metrics[name] for f in firsts) / len(firsts)
        if samples_per_item:
            samples = [s for _, done in entries for s in done]
            metrics[f"eval/sampled_accuracy/{kind}"] = sum(s.correct for s in samples) / max(1, len(samples))
            for name in samples[0].metrics if samples else []:
                metrics[f"eval/sampled_{name}/{kind}"] = sum(s.metrics[name] for s in samples) / len(samples)
    return EvalReport(metrics, rows, table)
