"""One arm of the OPD experiment in plain PyTorch: sample groups with inline tool calls, score them
with the teacher, take one optimiser step, and evaluate on the held-out items.

    python -m experiments.opd_plain.loop --bundle bundle.json --arm opd --lr 1e-4 --seed 0 --out arm.jsonl

Independent of the project's rollout and trainer code: generation is a batched decode loop over
the model's KV cache in which a tool response is fed to its row as forced tokens (masked from the
loss), the reward is the boxed answer's match, and the losses are written out here:
- `grpo`: the group-normalised advantage of the reward on every sampled token (REINFORCE, one
  on-policy step per batch, so no ratio or clip is needed).
- `opd`: the per-token advantage `teacher_lp - student_lp` (clamped at +-5 nats, detached) on every
  sampled token: the sampled-token estimate of the reverse KL's gradient.
- `opd_full`: the exact reverse KL over the whole vocabulary at every sampled position, what
  `opd_topk`'s top-K + tail approximates.
- `mix`: the `grpo` and `opd` advantages added.
Every arm logs the per-token reverse KL to the teacher on its fresh samples (sampled estimate and
exact) and, at each evaluation, on the student's samples of the same held-out items with the same
seed, so that a fall is the student's, not the items'.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from experiments.opd_plain.tools import answer_call

logger = logging.getLogger(__name__)

ARMS = ("grpo", "opd", "opd_full", "mix")
# The clamp of the sampled-token advantage, in nats (the project's `trainer.teacher_clip`).
ADVANTAGE_CLAMP = 5.0
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


@dataclass
class Row:
    """One rollout being generated: its ids, which of them were sampled, and its state."""

    prompt_len: int
    tokens: list[int]
    sampled: list[bool] = field(default_factory=list)
    # The sampler's logprob of each sampled token (checked against the training forward's).
    sampler_logprobs: list[float] = field(default_factory=list)
    forced: list[int] = field(default_factory=list)
    segment_start: int = 0
    calls: int = 0
    generated: int = 0
    done: bool = False
    finish: str = ""
    greedy: bool = False


class Decoder:
    """Generates rollouts for a model with the fixture's inline tool format."""

    def __init__(self, tokenizer: Any, bundle: dict[str, Any], device: torch.device) -> None:
        self.tokenizer, self.device = tokenizer, device
        self.tok = bundle["tokens"]
        self.text = bundle["text"]
        self.limits = bundle["limits"]

    def _on_call_end(self, row: Row) -> None:
        """The row just sampled the call's end: answer the call, or end the rollout."""
        segment = self.tokenizer.decode(row.tokens[row.segment_start:], skip_special_tokens=False)
        if self.text["reasoning_end"] in segment:
            row.done, row.finish = True, "tool_after_think"
            return
        start = segment.rfind(self.text["call_start"])
        if row.calls >= self.limits["max_tool_calls"]:
            shown: dict[str, Any] = {"error": f"tool call limit ({self.limits['max_tool_calls']}) reached; give the final answer now"}
        elif start == -1:
            shown = {"error": f"{self.text['call_end']} without {self.text['call_start']}"}
        else:
            row.calls += 1
            shown = answer_call(segment[start + len(self.text["call_start"]): segment.rfind(self.text["call_end"])])
        response = "\n<tool_response>\n" + json.dumps(shown, ensure_ascii=False) + "\n</tool_response>\n"
        row.forced = self.tokenizer.encode(response, add_special_tokens=False)

    @torch.no_grad()
    def generate(self, model: Any, prompts: list[list[int]], greedy: list[bool], generator: torch.Generator) -> list[Row]:
        """One rollout per prompt at temperature 1 (or greedy where `greedy`), all in one batch."""
        rows = [Row(len(p), list(p), [False] * len(p), segment_start=len(p), greedy=g) for p, g in zip(prompts, greedy)]
        width = max(len(p) for p in prompts)
        batch = len(rows)
        total = width + self.limits["max_new_tokens"] + 64 * (self.limits["max_tool_calls"] + 1)
        attention = torch.zeros(batch, total, dtype=torch.long, device=self.device)
        ids = torch.zeros(batch, width, dtype=torch.long, device=self.device)
        for i, p in enumerate(prompts):  # left-padded
            ids[i, width - len(p):] = torch.tensor(p, device=self.device)
            attention[i, width - len(p):width] = 1
        positions = (attention[:, :width].cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=attention[:, :width], position_ids=positions, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1].float()
        next_pos = attention[:, :width].sum(-1)
        greedy_rows = torch.tensor(greedy, device=self.device)
        length = width
        eos, call_end = self.tok["eos"], self.tok["call_end"]
        while not all(r.done and not r.forced for r in rows) and length < total:
            sampled = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)[:, 0]
            picked = torch.where(greedy_rows, logits.argmax(-1), sampled)
            chosen_lp = torch.log_softmax(logits, -1).gather(-1, picked[:, None])[:, 0]
            chosen, chosen_lps = torch.stack([picked.double(), chosen_lp.double()]).tolist()
            step_ids, live = [], []
            for row, token, token_lp in zip(rows, map(int, chosen), chosen_lps):
                if row.forced:
                    token = row.forced.pop(0)
                    row.tokens.append(token)
                    row.sampled.append(False)
                    if not row.forced:
                        row.segment_start = len(row.tokens)
                    step_ids.append(token)
                    live.append(1)
                    continue
                if row.done:
                    step_ids.append(0)
                    live.append(0)
                    continue
                row.tokens.append(token)
                row.sampled.append(True)
                row.sampler_logprobs.append(token_lp)
                row.generated += 1
                step_ids.append(token)
                live.append(1)
                if token == eos:
                    row.done, row.finish = True, "eos"
                elif token == call_end:
                    self._on_call_end(row)
                if not row.done and row.generated >= self.limits["max_new_tokens"]:
                    row.done, row.finish, row.forced = True, "max_new_tokens", []
            attention[:, length] = torch.tensor(live, device=self.device)
            length += 1
            out = model(input_ids=torch.tensor(step_ids, device=self.device)[:, None], attention_mask=attention[:, :length],
                        position_ids=next_pos[:, None], past_key_values=cache, use_cache=True)
            next_pos = next_pos + attention[:, length - 1]
            cache, logits = out.past_key_values, out.logits[:, -1].float()
        return rows


def final_answer(text: str, reasoning_end: str) -> str | None:
    """The last `\\boxed{}` after the reasoning's end, or None."""
    end = text.rfind(reasoning_end)
    if end == -1:
        return None
    found = _BOXED.findall(text[end:])
    return found[-1] if found else None


def correct(tokenizer: Any, row: Row, answer: str, bundle: dict[str, Any]) -> bool:
    """Does the rollout's final answer equal `answer` (as text, or as an integer)?"""
    text = tokenizer.decode(row.tokens[row.prompt_len:], skip_special_tokens=False)
    predicted = final_answer(text, bundle["text"]["reasoning_end"])
    if predicted is None or len(predicted) > bundle["limits"]["max_answer_chars"]:
        return False
    predicted, answer = predicted.strip().strip("$").replace(" ", ""), answer.strip()
    if predicted == answer:
        return True
    try:
        return re.fullmatch(r"[-+]?\d+", predicted) is not None and int(predicted) == int(answer)
    except ValueError:
        return False


def padded(rows: list[Row], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and the mask of the sampled positions (predicted from the one before)."""
    length = max(len(r.tokens) for r in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, :len(r.tokens)] = torch.tensor(r.tokens)
        mask[i, :len(r.tokens)] = torch.tensor(r.sampled)
    return ids.to(device), mask.to(device)


def token_logprobs(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Log-softmax over the vocabulary at every sampled position: [sampled tokens, vocabulary]."""
    logits = model(input_ids=ids).logits[:, :-1]
    return torch.log_softmax(logits[mask[:, 1:]].float(), -1)


def kl_terms(student_lp: torch.Tensor, teacher_lp: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sampled token: the student's and the teacher's logprob of it, the sampled estimate of the
    reverse KL (their difference) and the exact reverse KL over the vocabulary."""
    s = student_lp.gather(-1, tokens[:, None])[:, 0]
    t = teacher_lp.gather(-1, tokens[:, None])[:, 0]
    exact = (student_lp.exp() * (student_lp - teacher_lp)).sum(-1)
    return s, t, s - t, exact


def loss_of(arm: str, student_lp: torch.Tensor, teacher_lp: torch.Tensor, tokens: torch.Tensor, sequence_advantage: torch.Tensor) -> torch.Tensor:
    """The arm's loss, a mean over the batch's sampled tokens."""
    s, t, _, exact = kl_terms(student_lp, teacher_lp, tokens)
    if arm == "opd_full":
        return exact.mean()
    teacher_advantage = (t - s).detach().clamp(-ADVANTAGE_CLAMP, ADVANTAGE_CLAMP)
    advantage = {"grpo": sequence_advantage, "opd": teacher_advantage, "mix": sequence_advantage + teacher_advantage}[arm]
    return -(advantage * s).mean()


def group_advantages(rewards: list[float], group: int) -> list[float]:
    """(r - mean) / (std + 1e-6) within each group of `group` rollouts; zeros for equal rewards."""
    out = []
    for start in range(0, len(rewards), group):
        chunk = torch.tensor(rewards[start:start + group], dtype=torch.float64)
        std = chunk.std(unbiased=False)
        out += [0.0] * len(chunk) if std < 1e-6 else ((chunk - chunk.mean()) / (std + 1e-6)).tolist()
    return out


@dataclass
class Setup:
    """What one arm's run reads."""

    bundle: dict[str, Any]
    student: Any
    teacher: Any
    tokenizer: Any
    device: torch.device
    decoder: Decoder
    # How many held-out items are evaluated (the first ones of the split).
    eval_items: int = 40


def evaluate(setup: Setup, model: Any, samples: int, seed: int) -> dict[str, Any]:
    """Held-out accuracy of `model` (sampled x `samples` at T=1 with a fixed seed, and greedy), and
    the reverse KL to the teacher on its sampled rollouts; per item, for paired comparisons."""
    items = setup.bundle["eval"][: setup.eval_items]
    prompts = [it["prompt_ids"] for it in items for _ in range(samples)] + [it["prompt_ids"] for it in items]
    greedy = [False] * (len(items) * samples) + [True] * len(items)
    generator = torch.Generator(device=setup.device).manual_seed(10_000 + seed)
    model.eval()
    rows = setup.decoder.generate(model, prompts, greedy, generator)
    hits = [correct(setup.tokenizer, r, items[i // samples]["answer"], setup.bundle) for i, r in enumerate(rows[: len(items) * samples])]
    greedy_hits = [correct(setup.tokenizer, r, it["answer"], setup.bundle) for r, it in zip(rows[len(items) * samples:], items)]
    sampled_rows = rows[: len(items) * samples]
    kl_sampled, kl_exact = [], []
    with torch.no_grad():
        for chunk in range(0, len(sampled_rows), 64):
            part = sampled_rows[chunk:chunk + 64]
            ids, mask = padded(part, setup.device)
            s_lp = token_logprobs(model, ids, mask)
            t_lp = token_logprobs(setup.teacher, ids, mask)
            _, _, est, exact = kl_terms(s_lp, t_lp, ids[:, 1:][mask[:, 1:]])
            counts = mask[:, 1:].sum(-1).tolist()
            for piece_est, piece_exact in zip(est.split(counts), exact.split(counts)):
                kl_sampled.append(piece_est.sum().item())
                kl_exact.append(piece_exact.sum().item())
    tokens = [sum(r.sampled) for r in sampled_rows]

    def per_item(values: list[float]) -> list[float]:
        return [sum(values[i * samples:(i + 1) * samples]) for i in range(len(items))]

    return {
        "sampled_accuracy": sum(hits) / len(hits),
        "greedy_accuracy": sum(greedy_hits) / len(greedy_hits),
        "item_correct": per_item([float(h) for h in hits]),
        "item_kl_exact": per_item(kl_exact),
        "item_kl_sampled": per_item(kl_sampled),
        "item_tokens": per_item([float(t) for t in tokens]),
        "reverse_kl_exact": sum(kl_exact) / max(1, sum(tokens)),
        "reverse_kl_sampled": sum(kl_sampled) / max(1, sum(tokens)),
        "mean_tokens": sum(tokens) / len(tokens),
    }


def run_arm(setup: Setup, arm: str, lr: float, seed: int, steps: int, problems: int, group: int, eval_every: int, eval_samples: int,
            wall_s: float, out: Path) -> None:
    """Train the student with `arm`'s loss for `steps` optimiser steps (or until `wall_s`), one JSON
    line per step and per evaluation in `out`."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = setup.student
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    generator = torch.Generator(device=setup.device).manual_seed(seed)
    order: list[dict[str, Any]] = []
    started = time.monotonic()
    with out.open("w") as sink:
        def emit(record: dict[str, Any]) -> None:
            sink.write(json.dumps({"arm": arm, "lr": lr, "seed": seed, "wall_s": round(time.monotonic() - started, 2), **record}) + "\n")
            sink.flush()

        for step in range(steps + 1):
            if step % eval_every == 0 or step == steps or time.monotonic() - started > wall_s:
                emit({"kind": "eval", "step": step, "rollouts": step * problems * group, **evaluate(setup, model, eval_samples, seed)})
                if step == steps or time.monotonic() - started > wall_s:
                    return
            while len(order) < problems:  # every arm of a seed sees the same items in the same order
                epoch = list(setup.bundle["train"])
                rng.shuffle(epoch)
                order += epoch
            items, order = order[:problems], order[problems:]
            model.eval()
            rows = setup.decoder.generate(model, [it["prompt_ids"] for it in items for _ in range(group)], [False] * (problems * group), generator)
            rewards = [float(correct(setup.tokenizer, r, items[i // group]["answer"], setup.bundle)) for i, r in enumerate(rows)]
            advantages = group_advantages(rewards, group)
            ids, mask = padded(rows, setup.device)
            model.train()
            s_lp = token_logprobs(model, ids, mask)
            with torch.no_grad():
                t_lp = token_logprobs(setup.teacher, ids, mask)
            tokens = ids[:, 1:][mask[:, 1:]]
            counts = mask[:, 1:].sum(-1)
            sequence_advantage = torch.repeat_interleave(torch.tensor(advantages, device=setup.device, dtype=torch.float32), counts)
            loss = loss_of(arm, s_lp, t_lp, tokens, sequence_advantage)
            optimizer.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            with torch.no_grad():
                s_tok, _, est, exact = kl_terms(s_lp.detach(), t_lp, tokens)
                sampler = torch.tensor([lp for r in rows for lp in r.sampler_logprobs], device=setup.device)
            emit({"kind": "step", "step": step + 1, "reward": sum(rewards) / len(rewards), "loss": loss.item(), "grad_norm": grad_norm.item(),
                  "sampler_mismatch": (s_tok - sampler).abs().mean().item(),
                  "reverse_kl_sampled": est.mean().item(), "reverse_kl_exact": exact.mean().item(), "tokens": int(counts.sum()),
                  "items": [it["id"] for it in items]})


def load(bundle: Path, student: str, teacher: str, device: str, eval_items: int = 40) -> Setup:
    """The bundle, both models on `device` (the teacher frozen) and the tokenizer."""
    from transformers import AutoTokenizer

    where = torch.device(device)
    data = json.loads(bundle.read_text())
    tokenizer = AutoTokenizer.from_pretrained(student)
    teacher_model = AutoModelForCausalLM.from_pretrained(teacher, dtype=torch.float32).to(where).eval()
    for p in teacher_model.parameters():
        p.requires_grad_(False)
    return Setup(data, AutoModelForCausalLM.from_pretrained(student, dtype=torch.float32).to(where), teacher_model, tokenizer, where,
                 Decoder(tokenizer, data, where), eval_items)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, required=True, help="items and prompts (experiments.opd_plain.bundle)")
    parser.add_argument("--student", default="opd/fixture/student", help="the student model directory")
    parser.add_argument("--teacher", default="opd/fixture/teacher", help="the teacher model directory")
    parser.add_argument("--arm", choices=ARMS, required=True)
    parser.add_argument("--lr", type=float, default=1e-4, help="AdamW's learning rate")
    parser.add_argument("--seed", type=int, default=0, help="the items' order, the sampling and the evaluation's seed")
    parser.add_argument("--steps", type=int, default=200, help="optimiser steps")
    parser.add_argument("--problems", type=int, default=8, help="problems per optimiser step")
    parser.add_argument("--group", type=int, default=8, help="rollouts per problem")
    parser.add_argument("--eval-every", type=int, default=25, help="optimiser steps between evaluations")
    parser.add_argument("--eval-samples", type=int, default=8, help="sampled rollouts per held-out item")
    parser.add_argument("--eval-items", type=int, default=40, help="held-out items evaluated")
    parser.add_argument("--eval-teacher", action="store_true", help="first evaluate the teacher on the same items (the ceiling)")
    parser.add_argument("--wall-s", type=float, default=1e9, help="stop (after a last evaluation) once this many seconds have passed")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, required=True, help="the JSON-lines file of steps and evaluations")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 throughout, as on the CPU
    setup = load(args.bundle, args.student, args.teacher, args.device, args.eval_items)
    if args.eval_teacher:
        ceiling = evaluate(setup, setup.teacher, args.eval_samples, args.seed)
        args.out.with_suffix(".teacher.json").write_text(json.dumps({"kind": "teacher", "seed": args.seed, **ceiling}))
    run_arm(setup, args.arm, args.lr, args.seed, args.steps, args.problems, args.group, args.eval_every, args.eval_samples, args.wall_s, args.out)


if __name__ == "__main__":
    main()
