"""The reference trainer (opd/train/): batches from records, loss terms that read only trained
positions and never a pad, one optimiser step on the fixture model."""

from __future__ import annotations

import copy
import math

import pytest

from conftest import compose
from opd.config import validate
from opd.records import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB, MASK, MASKED_LOGPROB

torch = pytest.importorskip("torch")


def sequence(prompt: list[int], generated: list[int], lp: float = -1.0) -> tuple[list[int], list[int], list[float]]:
    return prompt + generated, [MASK] * len(prompt) + generated, [MASKED_LOGPROB] * len(prompt) + [lp] * len(generated)


def recorded_group(scores: list[float], k: int = 3, teacher: bool = True) -> dict:
    """A group as opd_coding writes it: prompt, a sampled turn, teacher rows on part of it."""
    group: dict = {"tokens": [], "masks": [], "inference_logprobs": [], "scores": scores, "overrides": [],
                   "distill_token_ids": [], "distill_logprobs": [], "group_overrides": {"item_id": "x"}}
    for i, _ in enumerate(scores):
        tokens, masks, lps = sequence([5, 6, 7, 8], [20 + i, 21, 22, 23, 24])
        group["tokens"].append(tokens)
        group["masks"].append(masks)
        group["inference_logprobs"].append(lps)
        rows = [[DISTILL_PAD_ID] * k for _ in tokens]
        row_lps = [[DISTILL_PAD_LOGPROB] * k for _ in tokens]
        teacher_lps: list = [None] * len(tokens)
        if teacher:
            for p in (5, 6):
                rows[p] = [tokens[p], 30, 31]
                row_lps[p] = [-0.5, -2.0, -3.0]
                teacher_lps[p] = -0.5
        group["distill_token_ids"].append(rows)
        group["distill_logprobs"].append(row_lps)
        group["overrides"].append({"teacher_logprobs": teacher_lps})
    return group


def test_advantages_are_normalised_within_each_group_and_zero_when_all_equal() -> None:
    from opd.train.batch import group_advantages, make_batch

    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    a = group_advantages([0.0, 1.0])
    assert a[0] == pytest.approx(-1.0, abs=1e-4) and a[1] == pytest.approx(1.0, abs=1e-4)
    batch = make_batch([recorded_group([0.0, 1.0]), recorded_group([2.0, 2.0])])
    assert batch.advantages.tolist()[2:] == [0.0, 0.0] and batch.tokens.shape == (4, 9)


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
    for name in ("pg", "opd", "topk_kl", "kl_to_sampler"):
        assert float(getattr(same, name)) == pytest.approx(float(getattr(base, name)), rel=1e-6), name
    # Changing a trained position's sampler logprob does.
    moved = copy.deepcopy(group)
    moved["inference_logprobs"][1][6] = -5.0
    assert float(terms(logits, make_batch([moved]), 0.2).pg) != pytest.approx(float(base.pg))
    assert all(math.isfinite(float(getattr(base, name))) for name in ("pg", "opd", "topk_kl", "kl_to_sampler"))


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
    group = {"tokens": [tokens], "masks": [masks], "inference_logprobs": [lps], "scores": [1.0], "overrides": [{}], "group_overrides": {"item_id": "x"}}
    batch = make_batch([group])
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
    matched = float(terms(logits, batch, 0.2).topk_kl)
    assert matched == pytest.approx(0.0, abs=1e-4)
    logits[:, 4, 40] = 5.0
    assert float(terms(logits, batch, 0.2).topk_kl) > 0.1


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
