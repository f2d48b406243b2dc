"""The fixture build: the teacher shares the fixture's tokenizer, the committed builds are what
their recorded configs rebuild, the shared-prefix training computes the same loss, and the
teacher's target: held-out problems the fixture cannot answer (real vLLM)."""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from opd.fixture import build as fixture_build
from opd.fixture import transcripts as tr


def test_the_teacher_uses_the_fixtures_tokenizer_files_exactly() -> None:
    from transformers import AutoTokenizer

    for name in fixture_build.TOKENIZER_FILES:
        assert (fixture_build.TEACHER_DIR / name).read_bytes() == (fixture_build.DEFAULT_DIR / name).read_bytes(), name
    student = AutoTokenizer.from_pretrained(str(fixture_build.DEFAULT_DIR))
    teacher = AutoTokenizer.from_pretrained(str(fixture_build.TEACHER_DIR))
    assert teacher.get_vocab() == student.get_vocab() and len(teacher) == len(student) == 4096
    assert teacher.all_special_tokens == student.all_special_tokens
    assert {i: str(t) for i, t in teacher.added_tokens_decoder.items()} == {i: str(t) for i, t in student.added_tokens_decoder.items()}
    assert teacher.chat_template == student.chat_template
    config = json.loads((fixture_build.TEACHER_DIR / "config.json").read_text())
    # What vLLM's CPU build serves like the fixture: Qwen2, head_dim 64, the tokenizer's vocabulary.
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["head_dim"] == 64 and config["vocab_size"] == 4096
    assert config["eos_token_id"] == student.eos_token_id


@pytest.mark.parametrize("preset", ["fixture", "teacher", "student"])
def test_each_committed_build_records_the_preset_that_rebuilds_it(preset: str) -> None:
    import hashlib

    directory = fixture_build.PRESET_DIRS[preset]
    recorded = json.loads((directory / "build_config.json").read_text())
    assert fixture_build.load_build_config(directory / "build_config.json") == fixture_build.PRESETS[preset]
    assert hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest() == recorded["report"]["weights_sha256"]


def test_the_fixture_weights_are_the_committed_ones() -> None:
    # The teacher's build must leave the fixture alone (its weights are what every test ran on).
    import hashlib

    weights = (fixture_build.DEFAULT_DIR / "model.safetensors").read_bytes()
    assert hashlib.sha256(weights).hexdigest() == "fecc5aa29a4904a41996ef25a01cf50bb0a7a6040137f55e0ff3f2912adbec2f"


def test_a_recorded_config_with_unknown_fields_is_refused_naming_them(tmp_path: Path) -> None:
    path = tmp_path / "build_config.json"
    path.write_text(json.dumps({"config": {"seed": 1, "layers": 3}}))
    with pytest.raises(ValueError, match=r"unknown build fields \['layers'\]"):
        fixture_build.load_build_config(path)
    path.write_text(json.dumps({"config": {"seed": 1}}))
    assert fixture_build.load_build_config(path) == fixture_build.BuildConfig(seed=1)


def test_fresh_math_problems_cover_every_kind_and_never_the_held_out_split() -> None:
    from opd.data import math_builtin
    from opd.data.splits import train_eval_split

    train, held_out = train_eval_split(math_builtin.generate(), eval_size=40, seed=0)
    excluded = {p["problem"] for p in held_out}
    pick = tr.fresh_problem_picker(excluded)
    rng = random.Random(0)
    drawn = [pick(rng) for _ in range(3000)]
    assert not excluded & {p["problem"] for p in drawn}
    kinds = Counter(p["kind"] for p in drawn)
    assert set(kinds) == set(math_builtin.KINDS) and min(kinds.values()) > 3000 / 9 * 0.8
    # Far more distinct problems than the 360 of the train split (copying, not memorising, pays).
    assert len({p["problem"] for p in drawn}) > 2000
    # Every drawn problem is solved by its own expression, as the transcripts' tool calls are.
    for problem in drawn[:50]:
        assert str(eval(problem["expression"])) == problem["answer"]  # noqa: S307 (our own generator's text)
    # A held-out problem the rng would draw is drawn again: with everything of one kind excluded,
    # that kind never comes back.
    squares = {p["problem"] for p in math_builtin.generate(38, kinds=["square"])}
    assert all(p["kind"] != "square" for p in (tr.fresh_problem_picker(squares)(rng) for _ in range(300)))


def test_math_transcripts_over_the_train_split_are_unchanged_by_the_picker_option() -> None:
    from opd.data import math_builtin
    from opd.data.splits import train_eval_split

    train, _ = train_eval_split(math_builtin.generate(), eval_size=40, seed=0)
    default = tr.math_transcripts(train, 30, 3)
    explicit = tr.math_transcripts(train, 30, 3, lambda rng: rng.choice(train))
    assert default == explicit
    assert {tr.kind_of(t) for t in default} == {"math"}


def _tiny_model():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, head_dim=32, max_position_embeddings=256, tie_word_embeddings=True, pad_token_id=0)
    return Qwen2ForCausalLM(config)


def _examples(prefix: list[int], rng: random.Random) -> list[tuple[list[int], list[bool]]]:
    out = []
    for _ in range(5):
        prompt = prefix + [rng.randrange(1, 64) for _ in range(rng.randrange(1, 6))]
        answer = [rng.randrange(1, 64) for _ in range(rng.randrange(2, 12))]
        out.append((prompt + answer, [False] * len(prompt) + [True] * len(answer)))
    return out


def test_the_shared_prefix_loss_and_gradients_equal_the_padded_ones() -> None:
    model = _tiny_model()
    rng = random.Random(1)
    batch = _examples([rng.randrange(1, 64) for _ in range(40)], rng)
    assert fixture_build.shared_prefix_length(batch) >= 40

    def run(loss_fn):
        model.zero_grad()
        loss, tokens = loss_fn(model, batch, 0)
        loss.backward()
        return loss.item(), tokens, [p.grad.clone() for p in model.parameters()]

    padded_loss, padded_tokens, padded_grads = run(fixture_build._padded_loss)
    shared_loss, shared_tokens, shared_grads = run(fixture_build._prefix_loss)
    assert shared_loss == pytest.approx(padded_loss, rel=1e-5)
    assert shared_tokens < padded_tokens  # the prefix ran once, not five times
    for a, b in zip(padded_grads, shared_grads):
        assert (a - b).abs().max().item() < 1e-5 * max(1.0, a.abs().max().item())


def test_the_shared_prefix_stops_before_the_first_trained_token() -> None:
    same = ([5, 6, 7, 8, 9, 10], [False, False, False, True, True, True])
    # Identical examples: the prefix ends before the position whose logits predict token 3.
    assert fixture_build.shared_prefix_length([same, same]) == 2
    assert fixture_build.shared_prefix_length([same, ([5, 6, 1, 8], [False, False, True, True])]) == 1
    assert fixture_build.shared_prefix_length([same, ([4, 6, 7], [False, True, True])]) == 0
    # No shared prefix: the padded loss, the same number.
    model = _tiny_model()
    batch = [same, ([4, 6, 7], [False, True, True])]
    assert fixture_build._prefix_loss(model, batch, 0)[0].item() == fixture_build._padded_loss(model, batch, 0)[0].item()


def test_copying_the_tokenizer_fails_naming_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "tokenizer.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="tokenizer_config.json is missing"):
        fixture_build.copy_tokenizer(tmp_path / "src", tmp_path)


def test_the_probe_sorts_every_trained_token_and_scores_the_protocol_the_fixture_learned() -> None:
    from opd.fixture.build import math_split, runtime_tokenizer
    from opd.fixture.probe import CLASSES, copy_accuracy

    found = copy_accuracy(fixture_build.DEFAULT_DIR, transcripts=6, seed=3)
    # Every trained position of the same transcripts is counted once, digits where digits are.
    _, held_out = math_split()
    tokenizer = runtime_tokenizer(fixture_build.DEFAULT_DIR)
    encoded = [tr.encode(tokenizer, t) for t in tr.math_transcripts(held_out, 6, 3)]
    trained_ids = [i for ids, trained in encoded for i, t in zip(ids, trained) if t]
    digits = sum(tokenizer.decode([i]).strip().isdigit() for i in trained_ids)
    assert sum(found[c]["tokens"] for c in CLASSES) == len(trained_ids)
    assert found["call_digit"]["tokens"] + found["answer_digit"]["tokens"] == digits > 0
    assert all(found[c]["tokens"] > 0 for c in CLASSES), found
    # The fixture writes the protocol's words: a prediction read one position off would miss them.
    assert found["call_other"]["accuracy"] >= 0.8 and found["answer_other"]["accuracy"] >= 0.9, found


@pytest.mark.slow
def test_one_command_builds_the_teacher_and_its_record_rebuilds_it_bit_for_bit(tmp_path: Path) -> None:
    # A smoke-sized teacher (a few dozen transcripts, three steps): the same command as the
    # committed one, then a rebuild from the build_config.json it wrote, in another directory.
    fixture_build.main(["--preset", "teacher", "--out", str(tmp_path / "a"), "--scale", "0.003", "--steps", "3"])
    recorded = json.loads((tmp_path / "a" / "build_config.json").read_text())
    assert recorded["config"]["tokenizer_from"] == "model" and recorded["config"]["steps"] == 3
    scaled = int(fixture_build.PRESETS["teacher"].math_transcripts * 0.003)
    assert recorded["report"]["examples"] == recorded["config"]["math_transcripts"] == scaled  # math only: no coding, no judge
    for name in fixture_build.TOKENIZER_FILES:
        assert (tmp_path / "a" / name).read_bytes() == (fixture_build.DEFAULT_DIR / name).read_bytes()
    fixture_build.main(["--config", str(tmp_path / "a" / "build_config.json"), "--out", str(tmp_path / "b")])
    rebuilt = json.loads((tmp_path / "b" / "build_config.json").read_text())
    assert rebuilt["config"] == recorded["config"]
    assert rebuilt["report"]["weights_sha256"] == recorded["report"]["weights_sha256"]
    assert (tmp_path / "b" / "model.safetensors").read_bytes() == (tmp_path / "a" / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_a_build_stopped_early_is_the_longer_builds_own_snapshot_at_that_step(tmp_path: Path) -> None:
    # The student preset is the teacher's build stopped early: the same trajectory (the full
    # schedule's learning rate at each step), not a shorter schedule. One warm-up step, so that a
    # 3-step schedule's rates differ from a 6-step one's from the second step on.
    from dataclasses import replace

    def smoke(out: str, steps: int, stop_at: int | None = None, snapshots: tuple[int, ...] = ()) -> bytes:
        cfg = replace(fixture_build.PRESETS["teacher"], steps=steps, stop_at=stop_at, warmup_steps=1)
        cfg.math_transcripts = max(2, int(cfg.math_transcripts * 0.002))  # as --scale 0.002
        fixture_build.build(tmp_path / out, cfg, snapshots)
        return (tmp_path / out / "model.safetensors").read_bytes()

    final = smoke("long", 6, snapshots=(3,))
    stopped = smoke("stopped", 6, stop_at=3)
    assert stopped == (tmp_path / "long" / "step_3" / "model.safetensors").read_bytes()
    assert stopped != final
    assert stopped != smoke("short", 3)  # a 3-step schedule is another model
    assert json.loads((tmp_path / "stopped" / "build_config.json").read_text())["config"]["stop_at"] == 3
    for name in fixture_build.TOKENIZER_FILES:  # a snapshot is servable as it is
        assert (tmp_path / "long" / "step_3" / name).read_bytes() == (fixture_build.DEFAULT_DIR / name).read_bytes()


def test_the_student_is_the_teachers_build_stopped_early() -> None:
    student, teacher = fixture_build.PRESETS["student"], fixture_build.PRESETS["teacher"]
    assert student.stop_at is not None and student.stop_at < teacher.steps
    assert dataclasses.replace(student, stop_at=None) == teacher
    for name in ("config.json", *fixture_build.TOKENIZER_FILES):
        assert (fixture_build.STUDENT_DIR / name).read_bytes() == (fixture_build.TEACHER_DIR / name).read_bytes(), name


def _greedy_evaluation(out: Path, model: str, url: str | None = None) -> list[dict]:
    """`mode=evaluate` of inline_math's held-out split (40 items, greedy) on `model`: served at
    `url`, or (None) by the run's own vLLM; one line per item."""
    from conftest import compose
    from experiments.launch import launch
    from helpers import run_args

    server = run_args(out, model, url) if url else [f"server.model={model}", f"tracking.uri=sqlite:///{out / 'mlflow.db'}",
                                                    f"tracking.artifact_root={out / 'mlruns'}", "runner.progress=false"]
    launch(compose(["env=inline_math", "mode=evaluate", "eval.samples_per_item=0", *server, f"output_dir={out / 'run'}"]))
    return [json.loads(line) for line in (out / "run" / "eval" / "step_000000.jsonl").read_text().splitlines()]


@pytest.mark.vllm
@pytest.mark.slow
def test_the_teacher_answers_held_out_problems_the_fixture_cannot(tmp_path: Path, fixture_model: str, vllm_url: str) -> None:
    # The fixture on the session's server (its weights, the untied copy's same values); the
    # teacher on a server of the run's own.
    student = _greedy_evaluation(tmp_path / "fixture", fixture_model, vllm_url)
    teacher = _greedy_evaluation(tmp_path / "teacher", str(fixture_build.TEACHER_DIR))
    assert [r["item_id"] for r in student] == [r["item_id"] for r in teacher] and len(teacher) == 40
    small_answer_sets = {"parity", "digit_count"}
    student_right = sum(r["greedy_correct"] for r in student)
    teacher_right = sum(r["greedy_correct"] for r in teacher)
    teacher_arithmetic = sum(r["greedy_correct"] for r in teacher if r["kind"] not in small_answer_sets)
    # The fixture answers only the kinds with small answer sets; a teacher that copies numbers
    # answers the arithmetic kinds too.
    assert sum(r["greedy_correct"] for r in student if r["kind"] not in small_answer_sets) <= 2
    assert teacher_arithmetic >= 10, (teacher_arithmetic, teacher)
    assert teacher_right >= student_right + 10, (teacher_right, student_right)
