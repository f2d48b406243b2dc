"""The reference trainer (opd/train/): batches from records, loss terms that read only trained
positions and never a pad, one optimiser step on the fixture model."""

from __future__ import annotations

import copy
import random
import math

import pytest

from conftest import compose
from opd.config import validate
from helpers import make_group, sequence
from opd.records import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB, MASK, MASKED_LOGPROB

torch = pytest.importorskip("torch")


def recorded_group(scores: list[float], k: int = 3, teacher: bool = True) -> dict:
    """A group as opd_coding writes it: prompt, a sampled turn, teacher rows on part of it."""
    rollouts = [sequence([5, 6, 7, 8], [20 + i, 21, 22, 23, 24]) for i, _ in enumerate(scores)]
    recorded = make_group(rollouts, scores, overrides=[], distill_token_ids=[], distill_logprobs=[], group_overrides={"item_id": "x"})
    for tokens, _, _ in rollouts:
        rows = [[DISTILL_PAD_ID] * k for _ in tokens]
        row_lps = [[DISTILL_PAD_LOGPROB] * k for _ in tokens]
        teacher_lps: list = [None] * len(tokens)
        if teacher:
            for p in (5, 6):
                rows[p] = [tokens[p], 30, 31]
                row_lps[p] = [-0.5, -2.0, -3.0]
                teacher_lps[p] = -0.5
        recorded["distill_token_ids"].append(rows)
        recorded["distill_logprobs"].append(row_lps)
        recorded["overrides"].append({"teacher_logprobs": teacher_lps})
    return recorded


def test_advantages_are_normalised_within_each_group_and_zero_when_all_equal() -> None:
    from opd.train.batch import group_advantages, make_batch

    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    a = group_advantages([0.0, 1.0])
    assert a[0] == pytest.approx(-1.0, abs=1e-4) and a[1] == pytest.approx(1.0, abs=1e-4)
    batch = make_batch([recorded_group([0.0, 1.0]), recorded_group([2.0, 2.0])])
    assert batch.advantages.tolist()[2:] == [0.0, 0.0] and batch.tokens.shape == (4, 9)


def test_advantages_are_finite_and_ordered_for_any_finite_scores() -> None:
    """Scores near float64's largest: the mean's sum and the std's squares overflow in float64;
    computed as (score - mean) / (std + eps) they still are."""
    from opd.train.batch import group_advantages, make_batch

    # Two scores an ulp apart near the largest float; the largest and its negative.
    for scores in ([1e308, 1e308 - 1e292], [1.7e308, -1.7e308]):
        assert scores[0] > scores[1]
        assert group_advantages(scores) == pytest.approx([1.0, -1.0], abs=1e-12), scores
    three = group_advantages([1.7e308, -1.7e308, -1.7e308])
    assert three == pytest.approx([2**0.5, -(0.5**0.5), -(0.5**0.5)], abs=1e-12)
    # Huge, tiny and subnormal together: finite, in the scores' order.
    mixed = [1e308, 1.0, 5e-324, -1e-300, -1.7e308]
    advantages = group_advantages(mixed)
    assert all(math.isfinite(a) for a in advantages) and advantages[0] > advantages[1] > 0 > advantages[-1]
    assert sum(advantages) == pytest.approx(0.0, abs=1e-12)
    # Below eps in std (in the scores' own units): zeros, as for equal scores; just above it, not.
    assert group_advantages([5e-7, 0.0]) == [0.0, 0.0] and group_advantages([1e-300, 0.0]) == [0.0, 0.0]
    assert group_advantages([2.1e-6, 0.0]) == pytest.approx([1.05 / 2.05, -1.05 / 2.05], rel=1e-9)
    # Ordinary scores: (score - mean) / (std + eps), in float64 as before.
    rng = random.Random(0)
    for scores in ([0.0, 1.0], [1.0, 0.0, 0.0, 1.0, 1.0], [0.7, 0.5, -1.0, 0.25], [rng.uniform(-10, 10) for _ in range(64)]):
        t = torch.tensor(scores, dtype=torch.float64)
        expected = ((t - t.mean()) / (t.std(unbiased=False) + 1e-6)).tolist()
        assert group_advantages(scores) == pytest.approx(expected, abs=1e-12, rel=0)
    with pytest.raises(ValueError, match=r"scores\[1\] is not a finite number"):
        group_advantages([0.0, float("nan")])
    # The trainer's batch reads the same advantages.
    batch = make_batch([recorded_group([1e308, 1e308 - 1e292])])
    assert batch.advantages.tolist() == pytest.approx([1.0, -1.0], abs=1e-6)


def test_only_trained_positions_count_and_pads_are_never_read() -> None:
    from opd.train.batch import make_batch
    from opd.train.losses import terms

    group = recorded_group([0.0, 1.0])
    batch = make_batch([group])
    assert batch.trained[0].tolist() == [False] * 4 + [True] * 5
    assert batch.has_topk[0].tolist() == [False] * 5 + [True, True, False, False]
    assert (batch.topk_ids[~batch.has_topk] == 0).all()  # a pad id is never used as an index
    logits = torch.randn(2, 9, 64)
    base = terms(logits, batch, 0.2)
    # Changing what sits at masked positions, or the pads' values, changes nothing.
    altered = copy.deepcopy(group)
    for seq in range(2):
        altered["inference_logprobs"][seq][:4] = [MASKED_LOGPROB] * 4
        altered["distill_logprobs"][seq][0] = [DISTILL_PAD_LOGPROB] * 3
        altered["tokens"][seq][0] = 63  # the first token is never predicted
        altered["masks"][seq][0] = MASK
    same = terms(logits, make_batch([altered]), 0.2)
    for name in ("pg", "opd_advantage", "topk_kl"):
        assert float(same.losses[name]) == pytest.approx(float(base.losses[name]), rel=1e-6), name
    assert float(same.kl_to_sampler) == pytest.approx(float(base.kl_to_sampler), rel=1e-6)
    # Changing a trained position's sampler logprob does.
    moved = copy.deepcopy(group)
    moved["inference_logprobs"][1][6] = -5.0
    assert float(terms(logits, make_batch([moved]), 0.2).losses["pg"]) != pytest.approx(float(base.losses["pg"]))
    assert all(math.isfinite(float(value)) for value in [*base.losses.values(), base.kl_to_sampler])


def test_kl_to_sampler_estimates_kl_from_the_sampler_to_the_current_policy() -> None:
    """Tokens drawn from the sampler q, scored by the current policy p: the mean per trained token
    is KL(q || p) (the k3 estimator with r = p / q), not another divergence."""
    from opd.train.batch import make_batch
    from opd.train.losses import terms

    q = torch.tensor([0.7, 0.1, 0.1, 0.1])
    p = torch.full((4,), 0.25)
    generator = torch.Generator().manual_seed(0)
    drawn = torch.multinomial(q, 20000, replacement=True, generator=generator).tolist()
    tokens, masks, lps = sequence([0], drawn)
    lps = [MASKED_LOGPROB] + [math.log(float(q[t])) for t in drawn]
    batch = make_batch([make_group([(tokens, masks, lps)], [1.0], group_overrides={"item_id": "x"})])
    logits = p.log().expand(1, len(tokens), 4).clone()
    estimate = float(terms(logits, batch, 0.2).kl_to_sampler) / len(drawn)
    assert estimate == pytest.approx(float((q * (q / p).log()).sum()), abs=0.02)  # 0.446


def test_the_topk_kl_is_zero_when_the_student_matches_the_teacher_and_positive_otherwise() -> None:
    from opd.train.batch import make_batch
    from opd.train.losses import terms

    group = recorded_group([0.0, 1.0])
    batch = make_batch([group])
    logits = torch.full((2, 9, 64), -30.0)
    # At position p-1 the student puts the teacher's probabilities on the teacher's top-3 and the tail.
    teacher = torch.tensor([-0.5, -2.0, -3.0])
    tail = math.log(1 - float(teacher.exp().sum()))
    for seq in range(2):
        for p in (5, 6):
            ids = group["distill_token_ids"][seq][p]
            logits[seq, p - 1, ids] = teacher
            logits[seq, p - 1, 40] = tail  # one token holds the tail mass
    matched = float(terms(logits, batch, 0.2).losses["topk_kl"])
    assert matched == pytest.approx(0.0, abs=1e-4)
    logits[:, 4, 40] = 5.0
    assert float(terms(logits, batch, 0.2).losses["topk_kl"]) > 0.1


@pytest.fixture(scope="module")
def trainer_cfg():
    return validate(compose(["trainer=local", "trainer.micro_batch=2", "trainer.learning_rate=1e-3", "trainer.loss.topk_kl=0.5"])).trainer


def test_a_step_on_the_fixture_model_moves_the_sampled_tokens_the_way_the_advantage_says(fixture_model, trainer_cfg, tmp_path) -> None:
    from opd.train.batch import make_batch
    from opd.train.losses import token_logprobs
    from opd.train.trainer import LocalTrainer

    trainer = LocalTrainer(trainer_cfg, fixture_model)
    good, bad = [11, 12, 13, 14, 15], [16, 17, 18, 19, 20]
    group = {"tokens": [], "masks": [], "inference_logprobs": [], "scores": [1.0, 0.0], "overrides": [{}, {}], "group_overrides": {}}
    for generated in (good, bad):
        tokens, masks, _ = sequence([1, 2, 3, 4], generated)
        with torch.no_grad():
            lp = token_logprobs(trainer.model(input_ids=torch.tensor([tokens])).logits, torch.tensor([tokens]))[0][0]
        group["tokens"].append(tokens)
        group["masks"].append(masks)
        group["inference_logprobs"].append([MASKED_LOGPROB] * 4 + lp[4:].tolist())

    def seq_logprob(i: int) -> float:
        batch = make_batch([group])
        with torch.no_grad():
            lp = token_logprobs(trainer.model(input_ids=batch.tokens).logits, batch.tokens)[0]
        return float(lp[i][batch.trained[i]].sum())

    before = (seq_logprob(0), seq_logprob(1))
    metrics = trainer.step([group])
    after = (seq_logprob(0), seq_logprob(1))
    assert after[0] > before[0] and after[1] < before[1]  # the rewarded sequence became likelier
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["trainer/trained_tokens"] == 10 and metrics["trainer/kl_to_sampler"] == pytest.approx(0.0, abs=1e-4)
    saved = trainer.save(tmp_path / "weights")
    assert (saved / "model.safetensors").exists() and (saved / "tokenizer_config.json").exists() and (saved / "config.json").exists()
    import json

    from safetensors import safe_open

    with safe_open(str(saved / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
    # The fixture ties its output layer to its embedding; the checkpoint holds both, so that an
    # in-place reload refreshes the output layer too (opd/train/untied.py).
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= names
    assert json.loads((saved / "config.json").read_text())["tie_word_embeddings"] is False


def test_an_untied_checkpoint_gives_the_same_logits_and_its_output_layer_is_its_own(fixture_model, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    from opd.train.untied import output_layer_tied, save_untied, untied_copy

    tied = AutoModelForCausalLM.from_pretrained(fixture_model, dtype=torch.float32)
    assert output_layer_tied(tied)
    copy_dir = untied_copy(fixture_model, tmp_path / "copy")
    assert copy_dir is not None and (copy_dir / "tokenizer.json").exists()
    assert untied_copy(str(copy_dir), tmp_path / "again") is None  # untied already: nothing to copy
    untied = AutoModelForCausalLM.from_pretrained(copy_dir, dtype=torch.float32)
    assert not output_layer_tied(untied)
    ids = torch.tensor([[1, 40, 700, 12, 3000, 5]])
    with torch.no_grad():
        assert torch.equal(tied(input_ids=ids).logits, untied(input_ids=ids).logits)
        tied.get_input_embeddings().weight.mul_(2.0)  # the tied output layer moves with it
        changed = tied(input_ids=ids).logits
    saved = AutoModelForCausalLM.from_pretrained(save_untied(tied, tmp_path / "changed"), dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(saved(input_ids=ids).logits, changed)
        assert torch.equal(saved.lm_head.weight, tied.lm_head.weight) and not output_layer_tied(saved)


def test_a_new_loss_term_is_a_registered_function_and_a_weight(fixture_model, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer adds every configured term by its weight, a registered term it was never
    written for included; a weight naming no term is refused at the preflight."""
    from opd.build import preflight
    from opd.config import ConfigError
    from opd.train import losses
    from opd.train.trainer import LocalTrainer

    monkeypatch.setattr(losses, "LOSS_TERMS", losses.LOSS_TERMS.copy())

    @losses.loss_term("entropy_bonus")
    def entropy_bonus(x: losses.LossInputs) -> torch.Tensor:
        entropy = -(x.logsm.exp() * x.logsm).sum(-1)
        return torch.where(x.batch.trained, -entropy, torch.zeros_like(entropy)).sum()

    cfg = validate(compose(["trainer=local", "+trainer.loss.entropy_bonus=0.3"]))
    metrics = LocalTrainer(cfg.trainer, fixture_model).step([recorded_group([0.0, 1.0])])
    w = cfg.trainer.loss
    assert metrics["trainer/loss_entropy_bonus"] < 0
    assert metrics["trainer/loss"] == pytest.approx(sum(w[name] * metrics[f"trainer/loss_{name}"] for name in w), rel=1e-6)
    with pytest.raises(ConfigError, match="trainer.loss: no loss term named 'kl_penalty'"):
        preflight(validate(compose(["trainer=local", "+trainer.loss.kl_penalty=0.1"])), fixture_model)


def test_the_opd_advantage_is_clamped_and_counted() -> None:
    from opd.train.batch import make_batch
    from opd.train.losses import terms

    uniform = math.log(1 / 64)  # the student's logprob of every token under all-zero logits
    group = recorded_group([0.0, 1.0])
    for detail, lps in zip(group["overrides"], group["inference_logprobs"]):
        lps[4:] = [uniform] * 5  # the sampler is the student: ratio 1 everywhere
        detail["teacher_logprobs"][5] = uniform - 9.0  # advantage -9 at one token per sequence
        detail["teacher_logprobs"][6] = uniform + 2.0  # and +2 at the next
    batch = make_batch([group])
    logits = torch.zeros(2, 9, 64)
    free, bounded = terms(logits, batch, 0.2, None), terms(logits, batch, 0.2, 5.0)
    assert float(bounded.opd_clamped) == 2 and float(free.opd_clamped) == 0
    # Ratio 1 everywhere: nothing clipped; the sampler 1 nat less likely everywhere (ratio e): all clipped.
    assert float(free.clipped) == 0
    for lps in group["inference_logprobs"]:
        lps[4:] = [uniform - 1.0] * 5
    assert float(terms(logits, make_batch([group]), 0.2).clipped) == float(make_batch([group]).trained.sum())
    # At ratio 1 the surrogate is -advantage per token: 9 - 2 unbounded, 5 - 2 clamped, per sequence.
    assert float(free.losses["opd_advantage"]) == pytest.approx(2 * (9.0 - 2.0), rel=1e-5)
    assert float(bounded.losses["opd_advantage"]) == pytest.approx(2 * (5.0 - 2.0), rel=1e-5)


def test_every_loss_term_is_normalised_as_the_total_and_the_ratio_is_reported(fixture_model, tmp_path) -> None:
    from opd.train.trainer import LocalTrainer

    cfg = validate(compose(["trainer=local", "trainer.loss.topk_kl=0.5", "trainer.loss.opd_advantage=0.7"])).trainer
    trainer = LocalTrainer(cfg, fixture_model)
    group = recorded_group([0.0, 1.0])
    metrics = trainer.step([group])
    w = cfg.loss
    total = w["pg"] * metrics["trainer/loss_pg"] + w["opd_advantage"] * metrics["trainer/loss_opd_advantage"] + w["topk_kl"] * metrics["trainer/loss_topk_kl"]
    assert metrics["trainer/loss"] == pytest.approx(total, rel=1e-6)
    assert metrics["trainer/opd_tokens"] == 4 and metrics["trainer/topk_tokens"] == 4 and metrics["trainer/trained_tokens"] == 10
    # The sampler's logprobs are -1 on every trained token: the ratio is exp(new_lp + 1), per token.
    from opd.train.batch import make_batch
    from opd.train.losses import token_logprobs

    fresh = LocalTrainer(cfg, fixture_model)
    batch = make_batch([group])
    with torch.no_grad():
        ratios = token_logprobs(fresh.model(input_ids=batch.tokens).logits, batch.tokens)[0][batch.trained].add(1.0).exp()
    assert metrics["trainer/ratio_mean"] == pytest.approx(float(ratios.mean()), rel=1e-4)
    assert metrics["trainer/ratio_max"] == pytest.approx(float(ratios.max()), rel=1e-4)
    assert metrics["trainer/ratio_min"] == pytest.approx(float(ratios.min()), rel=1e-4)


def test_equal_score_groups_are_dropped_unless_they_carry_the_teachers_signal(fixture_model) -> None:
    from opd.train.trainer import LocalTrainer

    varied, equal, equal_hinted = recorded_group([0.0, 1.0], teacher=False), recorded_group([1.0, 1.0], teacher=False), recorded_group([1.0, 1.0])
    dropping = LocalTrainer(validate(compose(["trainer=local", "trainer.equal_score_groups=drop"])).trainer, fixture_model)
    kept, dropped = dropping.trainable([varied, equal, equal_hinted])
    assert kept == [varied, equal_hinted] and dropped == 1
    metrics = dropping.step([varied, equal])
    assert metrics["trainer/equal_score_groups_dropped"] == 1 and metrics["trainer/trained_tokens"] == 10  # one group's tokens
    assert dropping.step([equal]) is None and dropping.steps == 1  # nothing left: no step
    keeping = LocalTrainer(validate(compose(["trainer=local", "trainer.equal_score_groups=keep"])).trainer, fixture_model)
    metrics = keeping.step([varied, equal])
    assert metrics["trainer/equal_score_groups_dropped"] == 0 and metrics["trainer/trained_tokens"] == 20
    # Where no weighted term reads teacher rows (arm=grpo beside a teacher), an equal-score group
    # carrying them has nothing to teach: it would only dilute the policy gradient's token mean.
    grpo = LocalTrainer(validate(compose(["trainer=local", "arm=grpo"])).trainer, fixture_model)
    assert grpo.trainable([varied, equal, equal_hinted]) == ([varied], 2)


def test_the_refresh_check_accepts_the_noise_floor_and_fails_beyond_it_naming_the_keys(tokenizer) -> None:
    import asyncio

    from opd.serving.vllm_client import PromptScores
    from opd.train.refresh_check import SLACK, RefreshCheck, RefreshMismatch
    from scripted import ScriptedClient

    cfg = validate(compose(["trainer=local", "trainer.refresh_check.tolerance=1.5", "trainer.refresh_check.max_start=0.1"])).trainer.refresh_check
    check = RefreshCheck(cfg, ["http://unused/v1"], "fixture", tokenizer)
    assert len(check.ids) == cfg.tokens
    offset = {"value": 0.01}  # the server's logprobs sit this far from the trainer's

    def served(ids: list[int], k: int) -> PromptScores:
        return PromptScores([[] for _ in ids], [[] for _ in ids], [None] + [-1.0 + offset["value"]] * (len(ids) - 1))

    check.clients = [ScriptedClient(score=served, base_url="http://a/v1")]

    def trainer(ids: list[int], dtype: str) -> list[float]:
        assert dtype == "bfloat16"  # the servers' dtype (the fixture preset's)
        return [0.0] + [-1.0] * (len(ids) - 1)

    assert asyncio.run(check.start(trainer)) == pytest.approx(0.01)
    assert check.limit == pytest.approx(1.5 * 0.01 + SLACK)
    offset["value"] = 0.016
    assert asyncio.run(check.after_refresh(trainer, 1)) == pytest.approx(0.016)  # within 1.5 x 0.01 + slack
    offset["value"] = 0.03
    with pytest.raises(RefreshMismatch, match=r"weight version 2, the server at http://a/v1 does not serve.*0\.0300.*trainer\.refresh_check\.tolerance=1\.5"):
        asyncio.run(check.after_refresh(trainer, 2))
    fresh = RefreshCheck(cfg, ["http://unused/v1"], "fixture", tokenizer)
    fresh.clients = check.clients
    offset["value"] = 0.5  # another model entirely
    with pytest.raises(RefreshMismatch, match=r"does not serve the checkpoint the trainer starts from.*trainer\.refresh_check\.max_start=0\.1"):
        asyncio.run(fresh.start(trainer))


def test_the_probe_rounds_a_copy_of_the_weights_to_the_servers_dtype_and_leaves_the_trained_ones(fixture_model) -> None:
    from opd.train.refresh_check import mean_abs, probe_ids
    from opd.train.trainer import LocalTrainer

    trainer = LocalTrainer(validate(compose(["trainer=local"])).trainer, fixture_model)
    with torch.no_grad():  # trained weights are float32 numbers, not bf16 ones
        for parameter in trainer.model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0)) * 1e-3)
    before = {name: t.clone() for name, t in trainer.model.state_dict().items()}
    ids = probe_ids(trainer.tokenizer, 64)
    exact, rounded = trainer.probe_logprobs(ids), trainer.probe_logprobs(ids, "bfloat16")
    assert trainer.probe_logprobs(ids, "float32") == exact and len(exact) == 64 and exact[0] == 0.0
    assert 1e-4 < mean_abs([None, *rounded[1:]], exact) < 0.1
    assert all(torch.equal(before[name], t) for name, t in trainer.model.state_dict().items())  # untouched
    assert trainer.model.training  # and back in training mode


def test_a_prompt_shared_by_a_groups_rollouts_runs_once_with_the_same_loss_and_gradients(fixture_model) -> None:
    """trainer.shared_prefix: the group's prompt runs once, its keys and values expanded to every
    rollout; every term, metric and gradient is the whole-sequence pass's (two groups of rollouts
    of different lengths, so the rest is padded, with teacher rows and top-K rows)."""
    from opd.train.trainer import LocalTrainer, micro_batches

    rng = random.Random(3)
    groups = []
    for g in range(2):
        prompt = [rng.randrange(1, 4000) for _ in range(60 + g)]
        rollouts = [sequence(prompt, [rng.randrange(1, 4000) for _ in range(rng.randrange(3, 12))]) for _ in range(3)]
        group = make_group(rollouts, [0.0, 1.0, 0.5], overrides=[], distill_token_ids=[], distill_logprobs=[], group_overrides={"item_id": str(g)})
        for tokens, masks, _ in rollouts:
            trained = [m != MASK for m in masks]
            group["overrides"].append({"teacher_logprobs": [-rng.random() * 3 if t else None for t in trained]})
            group["distill_token_ids"].append([[rng.randrange(1, 4000) for _ in range(3)] if t else [DISTILL_PAD_ID] * 3 for t in trained])
            group["distill_logprobs"].append([sorted((-rng.random() * 4 for _ in range(3)), reverse=True) if t else [DISTILL_PAD_LOGPROB] * 3
                                              for t in trained])
        groups.append(group)
    assert [(s.start, s.stop) for s in micro_batches(groups, 2)] == [(0, 2), (2, 3), (3, 5), (5, 6)]  # never across groups

    def step(shared: bool) -> tuple[dict, list]:
        cfg = validate(compose(["trainer=local", "trainer.micro_batch=2", "trainer.learning_rate=1e-30", "trainer.max_grad_norm=1e9",
                                "trainer.loss.topk_kl=0.5", f"trainer.shared_prefix={str(shared).lower()}"])).trainer
        trainer = LocalTrainer(cfg, fixture_model)
        metrics = trainer.step(groups)
        return metrics, [p.grad.clone() for p in trainer.model.parameters()]

    whole, whole_grads = step(False)
    shared, shared_grads = step(True)
    for name in ("trainer/loss", "trainer/loss_pg", "trainer/loss_opd_advantage", "trainer/loss_topk_kl", "trainer/kl_to_sampler",
                 "trainer/reverse_kl_to_teacher", "trainer/trained_tokens", "trainer/opd_tokens", "trainer/topk_tokens", "trainer/ratio_mean"):
        assert shared[name] == pytest.approx(whole[name], rel=1e-4, abs=1e-6), name
    for a, b in zip(whole_grads, shared_grads):
        assert (a - b).abs().max().item() < 1e-4 * max(1.0, a.abs().max().item())
