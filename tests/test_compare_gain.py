"""experiments.compare's ranking of sweep points by paired held-out gain (experiment=opd_vs_grpo's
arms), on MLflow's real store with runs logged here as the launcher logs them: swept values as
params, eval/* histories, the per-item rows of each evaluation as eval/step_<N>.jsonl artifacts."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from opd.sinks.evaluation import paired_change

ITEMS = 30
SAMPLES = 8


def _rows(correct: list[int]) -> list[dict]:
    return [{"item_id": f"i{n}", "kind": "parity", "greedy_correct": False, "samples": SAMPLES, "sampled_correct": c}
            for n, c in enumerate(correct)]


def _final(rng: random.Random, start: list[int], rise: float) -> list[int]:
    """Each item's correct samples after training: `rise` of the way to all correct, plus noise."""
    return [max(0, min(SAMPLES, round(c + rise * (SAMPLES - c) + rng.choice([-1, 0, 0, 1])))) for c in start]


def _log_sweep(tmp_path: Path, rises: dict[str, list[float]], failed: str | None = None, teacher: list[int] | None = None) -> tuple[str, str, dict]:
    """A parent run and one child per arm and seed, as a sweep of `arm` with sweep.seeds logs them:
    three evaluations each (steps 0, 8, 16), the first the same for every job (same checkpoint,
    same seeded samples). `failed`: an arm whose job is logged FAILED with no evaluation.
    `teacher`: each item's correct samples of the teacher's evaluation, logged as a run with
    eval.teacher logs it (eval/teacher.jsonl, eval/gap_closed, eval/weight_version: one optimiser
    step per 4 groups, eval/wall_s)."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("inline_math", artifact_location=str(tmp_path / "mlruns"))
    parent = client.create_run(experiment, run_name="sweep", tags={"opd.swept": "arm,seed"}).info.run_id
    rng = random.Random(0)
    start = [rng.randint(0, 4) for _ in range(ITEMS)]
    logged: dict = {}
    arms = dict(rises)
    if failed:
        arms[failed] = []
    for arm, seeds in arms.items():
        for seed, rise in enumerate(seeds or [0.0]):
            run = client.create_run(experiment, run_name=f"arm={arm},seed={seed}",
                                    tags={"mlflow.parentRunId": parent, "opd.objective": "summary/eval_paired_gain"}).info.run_id
            client.log_param(run, "arm", arm)
            client.log_param(run, "seed", str(seed))
            client.log_param(run, "eval.confidence", "0.95")
            client.log_param(run, "group_size", "8")
            if arm == failed:
                client.set_terminated(run, "FAILED")
                continue
            evaluations = [_rows(start), _rows(_final(rng, start, rise / 2)), _rows(_final(rng, start, rise))]
            if teacher is not None:
                path = tmp_path / run / "teacher.jsonl"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("".join(json.dumps(r) + "\n" for r in _rows(teacher)))
                client.log_artifact(run, str(path), "eval")
                gap = (sum(teacher) - sum(start)) / (ITEMS * SAMPLES)
                for group in range(1, 17):  # the reverse KL on fresh samples falls with the arm's rise
                    client.log_metric(run, "teacher/reverse_kl", 1.0 - rise * group / 16, step=group)
                for step, rows in zip((0, 8, 16), evaluations):
                    client.log_metric(run, "eval/sampled_reverse_kl_to_teacher", 0.8 - rise * step / 16 + 0.01 * seed, step=step)
                    for n, row in enumerate(rows):  # per item: even items fall by 1.5x the mean, odd ones by 0.5x
                        row["sampled_reverse_kl_to_teacher"] = 0.8 + 0.01 * n - rise * step / 16 * (1.5 if n % 2 == 0 else 0.5)
                    client.log_metric(run, "eval/gap_closed", (sum(r["sampled_correct"] for r in rows) - sum(start)) / (ITEMS * SAMPLES) / gap, step=step)
                    client.log_metric(run, "eval/weight_version", step / 4, step=step)
                    client.log_metric(run, "eval/wall_s", step * 10.0, step=step)
            for step, rows in zip((0, 8, 16), evaluations):
                path = tmp_path / run / f"step_{step:06d}.jsonl"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("".join(json.dumps(r) + "\n" for r in rows))
                client.log_artifact(run, str(path), "eval")
                client.log_metric(run, "eval/sampled_accuracy", sum(r["sampled_correct"] for r in rows) / (ITEMS * SAMPLES), step=step)
            summary = paired_change(evaluations[0], evaluations[-1])
            for name, value in summary.items():
                client.log_metric(run, name, value)
            client.log_metric(run, "objective", summary["summary/eval_paired_gain"])
            client.set_terminated(run, "FINISHED")
            logged[(arm, seed)] = (run, summary, evaluations)
    client.set_terminated(parent, "FINISHED")
    return parent, uri, logged


def test_arms_are_ranked_by_paired_gain_with_the_runs_own_interval_and_the_best_told_apart(tmp_path: Path) -> None:
    from experiments.compare import compare, gain_separation

    parent, uri, logged = _log_sweep(tmp_path, {"grpo": [0.05], "opd": [0.3], "mix": [0.6]}, failed="broken")
    sweep, *_ = compare(parent, uri, out_dir=tmp_path / "out")
    assert [r["arm"] for r in sweep.ranking] == ["mix", "opd", "grpo"]  # the FAILED arm is not ranked
    for row in sweep.ranking:
        _, summary, _ = logged[(row["arm"], 0)]
        # One seed: exactly the run's own summary (same items, same bootstrap).
        for column in ("gain", "gain_low", "gain_high", "p"):
            assert row[column] == pytest.approx(summary[f"summary/eval_paired_{column}"]), column
        assert row["seeds"] == 1 and row["items"] == ITEMS
        assert row["final_accuracy"] == pytest.approx(row["first_accuracy"] + row["gain"])
    lines = gain_separation(sweep.ranking, sweep.confidence)
    assert lines[0].startswith("best: arm=mix, paired gain +")
    assert "vs arm=opd" in lines[1] and ": told apart" in lines[1] and "vs arm=grpo" in lines[2] and ": told apart" in lines[2]
    assert lines[-1] == "the best is told apart from every other"
    with (tmp_path / "out" / "compare_gain.csv").open() as handle:
        assert handle.readline().strip().split(",")[:6] == ["arm", "seeds", "items", "gain", "gain_low", "gain_high"]
    import mlflow

    logged_files = {Path(a.path).name for a in mlflow.MlflowClient(uri).list_artifacts(parent, "compare")}
    assert {"compare_gain.csv", "compare_gain.png"} <= logged_files
    assert (tmp_path / "out" / "compare_gain.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_over_seeds_each_arm_is_one_line_the_mean_of_its_seeds_with_their_range_and_close_arms_are_not_told_apart(tmp_path: Path) -> None:
    import mlflow

    from experiments.compare import gain_points, gain_ranking, gain_separation, load, mean_curves

    parent, uri, logged = _log_sweep(tmp_path, {"grpo": [0.30, 0.34], "opd": [0.32, 0.28], "mix": [0.0, 0.02]})
    client = mlflow.MlflowClient(uri)
    points = gain_points(load(parent, uri), client, tmp_path / "downloads")
    ranking = gain_ranking(points)
    assert {r["arm"] for r in ranking[:2]} == {"grpo", "opd"} and ranking[2]["arm"] == "mix" and all(r["seeds"] == 2 for r in ranking)
    # The gain is the mean over items of each item's change averaged over the seeds.
    grpo = next(r for r in ranking if r["arm"] == "grpo")
    changes = [[(b["sampled_correct"] - a["sampled_correct"]) / SAMPLES for a, b in zip(ev[0], ev[-1])]
               for (arm, _), (_, _, ev) in sorted(logged.items()) if arm == "grpo"]
    assert grpo["gain"] == pytest.approx(sum(sum(c) for c in changes) / (2 * ITEMS))
    assert grpo["gain_low"] < grpo["gain"] < grpo["gain_high"]
    lines = gain_separation(ranking)
    assert "NOT told apart" in lines[1] and lines[-1] == f"the best is NOT told apart from arm={ranking[1]['arm']}: which of them is best is not established"
    assert "told apart" in lines[2] and "NOT" not in lines[2]  # against mix, which barely moved
    curves = mean_curves(points, client)
    assert set(curves) == {"arm=grpo", "arm=opd", "arm=mix"}
    name, steps, mean, low, high = curves["arm=opd"]
    assert name == "eval/sampled_accuracy" and steps == [0, 8, 16]
    finals = [sum(r["sampled_correct"] for r in ev[-1]) / (ITEMS * SAMPLES) for (arm, _), (_, _, ev) in logged.items() if arm == "opd"]
    assert mean[-1] == pytest.approx(sum(finals) / 2) and (low[-1], high[-1]) == pytest.approx((min(finals), max(finals)))
    assert low[0] == high[0]  # every job starts from the same evaluation


def test_the_command_prints_the_ranking_and_its_verdict(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from experiments.compare import main

    parent, uri, _ = _log_sweep(tmp_path, {"grpo": [0.05], "mix": [0.6]})
    assert main([parent, "--tracking-uri", uri, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "ranked by paired held-out gain" in out and "best: arm=mix" in out and "vs arm=grpo" in out
    assert out.index("arm=mix") < out.index("vs arm=grpo")


def test_a_sweep_without_evaluations_has_no_gain_ranking(tmp_path: Path) -> None:
    import mlflow

    from experiments.compare import compare

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("x", artifact_location=str(tmp_path / "mlruns"))
    parent = client.create_run(experiment, tags={"opd.swept": "env.temperature"}).info.run_id
    for value in ("0.5", "1.0"):
        run = client.create_run(experiment, tags={"mlflow.parentRunId": parent}).info.run_id
        client.log_param(run, "env.temperature", value)
        client.log_metric(run, "objective", float(value))
        client.set_terminated(run, "FINISHED")
    sweep, *_ = compare(parent, uri, out_dir=tmp_path / "out")
    assert sweep.ranking == [] and not (tmp_path / "out" / "compare_gain.csv").exists()



def test_when_the_items_tell_the_arms_apart_and_two_seeds_do_not_the_command_says_why(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import mlflow

    from experiments.compare import gain_points, gain_ranking, gain_separation, load, main, points, separation, verdicts_disagree

    # Two seeds far apart: every item rises under mix, so the items tell it from grpo; two seeds cannot.
    parent, uri, _ = _log_sweep(tmp_path, {"grpo": [0.0, 0.05], "mix": [0.9, 0.25]})
    sweep = load(parent, uri)
    per_point, ranking = points(sweep), gain_ranking(gain_points(sweep, mlflow.MlflowClient(uri), tmp_path / "downloads"))
    assert "NOT told apart from the seeds' spread" in separation(per_point)
    assert gain_separation(ranking)[-1] == "the best is told apart from every other"
    why = verdicts_disagree(per_point, ranking)
    assert why.startswith(f"the verdicts differ: paired over {ITEMS} items the best is told apart, over 2 seeds it is not") and "sweep.seeds=N" in why
    assert main([parent, "--tracking-uri", uri, "--out", str(tmp_path / "out")]) == 0
    assert why in capsys.readouterr().out


def test_when_the_seeds_tell_the_arms_apart_and_the_items_do_not_the_reason_is_the_items() -> None:
    from experiments.compare import Point, gain_ranking, verdicts_disagree

    # Per item, mix minus grpo swings +0.5 / -0.4 (mean +0.05, too noisy over 10 items); every
    # seed sees the same swing, so the seeds' objectives differ by 0.05 with almost no spread.
    items = [f"i{n}" for n in range(10)]
    swing = [0.5 if n % 2 == 0 else -0.4 for n in range(10)]
    jitter = [0.0, 0.001, -0.001]
    mix = Point({"arm": "mix"}, ["m0", "m1", "m2"], [{i: 0.1 + d + j for i, d in zip(items, swing)} for j in jitter], [{i: 0.0 for i in items}] * 3)
    grpo = Point({"arm": "grpo"}, ["g0", "g1", "g2"], [{i: 0.1 + j for i in items} for j in jitter], [{i: 0.0 for i in items}] * 3)

    def both(points: list[Point]) -> tuple[list[dict], list[dict]]:
        """(the rows over seeds, the paired ranking) of `points`, as the command computes them."""
        objectives = {p.values["arm"]: [sum(c.values()) / len(c) for c in p.changes] for p in points}
        per_point = [{"arm": arm, "seeds": 3, "objective_mean": sum(v) / 3, "objectives": v} for arm, v in
                     sorted(objectives.items(), key=lambda kv: -sum(kv[1]))]
        return per_point, gain_ranking(points)

    per_point, ranking = both([grpo, mix])
    why = verdicts_disagree(per_point, ranking)
    assert why.startswith("the verdicts differ: over 3 seeds the best is told apart, paired over 10 items it is not") and "more items" in why
    assert verdicts_disagree(per_point[:1], ranking) == "" and verdicts_disagree(per_point, ranking[:1]) == ""
    # Verdicts that agree (mix +0.5 on every item, on every seed: told apart both ways) say nothing more.
    clear = Point({"arm": "mix"}, ["m0", "m1", "m2"], [{i: 0.6 + j for i in items} for j in jitter], [{i: 0.0 for i in items}] * 3)
    assert verdicts_disagree(*both([grpo, clear])) == ""
    # Ranked by another objective (accuracy, say), the runner-up over seeds need not be the paired
    # one. Paired, top's runner-up is mix (top minus mix: +0.1 on every item, told apart); over
    # seeds it is opd, which top beats by a noisy +0.11 per item (not told apart), nor over seeds:
    # the two verdicts on opd agree, and comparing the seeds' verdict on opd with the items' on
    # mix would report a false disagreement.
    top = Point({"arm": "top"}, ["t0", "t1", "t2"], [{i: 0.2 + d + j for i, d in zip(items, swing)} for j in jitter], [{i: 0.0 for i in items}] * 3)
    opd = Point({"arm": "opd"}, ["o0", "o1", "o2"], [{i: 0.14 + j for i in items} for j in jitter], [{i: 0.0 for i in items}] * 3)
    ranking = gain_ranking([top, opd, mix])
    assert [r["arm"] for r in ranking] == ["top", "mix", "opd"]
    per_point = [{"arm": "top", "seeds": 3, "objective_mean": 0.50, "objectives": [0.40, 0.50, 0.60]},
                 {"arm": "opd", "seeds": 3, "objective_mean": 0.45, "objectives": [0.35, 0.45, 0.55]},
                 {"arm": "mix", "seeds": 3, "objective_mean": 0.10, "objectives": [0.10, 0.11, 0.09]}]
    assert verdicts_disagree(per_point, ranking) == ""


def test_with_the_teachers_evaluation_each_arm_gets_its_gap_closed_and_the_steps_it_needed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from experiments.compare import compare, main

    rng = random.Random(5)
    teacher = [rng.randint(6, 8) for _ in range(ITEMS)]
    parent, uri, logged = _log_sweep(tmp_path, {"grpo": [0.1, 0.1], "opd": [0.6, 0.5]}, teacher=teacher)
    sweep, *_ = compare(parent, uri, out_dir=tmp_path / "out")
    for row in sweep.ranking:
        start = [r["sampled_correct"] / SAMPLES for r in logged[(row["arm"], 0)][2][0]]
        gap = sum(t / SAMPLES for t in teacher) / ITEMS - sum(start) / ITEMS
        assert row["teacher_accuracy"] == pytest.approx(sum(teacher) / (ITEMS * SAMPLES)) and row["gap"] == pytest.approx(gap)
        assert row["gap_closed"] == pytest.approx(row["gain"] / gap)
        assert (row["gap_closed_low"], row["gap_closed_high"]) == pytest.approx((row["gain_low"] / gap, row["gain_high"] / gap))
    speed = {row["point"]: row for row in sweep.speed}
    assert set(speed) == {"arm=grpo", "arm=opd"} and all(row["seeds"] == 2 for row in speed.values())
    assert speed["arm=opd"]["final_gap_closed"] > 0.3 > speed["arm=grpo"]["final_gap_closed"]
    assert speed["arm=opd"]["steps_to_0.1"] != "" and speed["arm=grpo"]["steps_to_0.5"] == ""
    # The reverse KL per window of 10 groups: one window of 16 groups, ending at group 10.
    assert speed["arm=opd"]["reverse_kl_first"] == pytest.approx(sum(1.0 - r * g / 16 for r in (0.6, 0.5) for g in range(1, 11)) / 20)
    # The held-out reverse KL at the first and last evaluation, mean over the seeds.
    assert (speed["arm=opd"]["reverse_kl_held_out_first"], speed["arm=opd"]["reverse_kl_held_out_last"]) == pytest.approx((0.805, 0.805 - 0.55))
    assert speed["arm=grpo"]["reverse_kl_held_out_last"] == pytest.approx(0.805 - 0.1)
    # Its change paired item by item (items' own rows, averaged over the seeds), with an interval
    # over items: -0.55 on the mean, -0.825 and -0.275 the two halves of the items.
    opd = speed["arm=opd"]
    assert opd["reverse_kl_held_out_change"] == pytest.approx(-0.55)
    assert -0.825 < opd["reverse_kl_held_out_change_low"] < -0.55 < opd["reverse_kl_held_out_change_high"] < -0.275
    assert speed["arm=grpo"]["reverse_kl_held_out_change"] == pytest.approx(-0.1)
    for name in ("compare_gap.png", "compare_kl.png"):
        assert (tmp_path / "out" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([parent, "--tracking-uri", uri, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "gap to the teacher closed" in out and "optimiser steps; arm=grpo never does in its budget" in out


def test_steps_to_a_level_are_read_between_evaluations_and_compared_with_the_grpo_arm() -> None:
    from experiments.compare.gap import Curve, baseline_label, speed_rows, speedups, steps_to

    fast = Curve({"eval/weight_version": [0, 10, 20]}, [0.0, 0.4, 0.6])
    slow = Curve({"eval/weight_version": [0, 10, 20]}, [0.0, 0.05, 0.2])
    assert steps_to(fast, 0.2) == pytest.approx(5.0) and steps_to(fast, 0.5) == pytest.approx(15.0)
    assert steps_to(slow, 0.2) == pytest.approx(20.0) and steps_to(slow, 0.5) is None
    assert steps_to(Curve({"eval/weight_version": [0, 10]}, [0.3, 0.1]), 0.25) == 0  # reached at the start
    rows = speed_rows({"arm=opd": [fast], "arm=grpo": [slow, slow]}, levels=(0.2, 0.5))
    assert rows[1] == {"point": "arm=grpo", "seeds": 2, "final_gap_closed": 0.2, "steps_to_0.2": 20.0, "steps_to_0.5": ""}
    assert baseline_label(["arm=opd", "arm=grpo"]) == "arm=grpo" and baseline_label(["arm=grpo_like"]) is None
    assert speedups(rows, "arm=grpo") == [
        "arm=opd reaches gap closed 0.2 in 5 optimiser steps, arm=grpo in 20: 4x fewer steps",
        "arm=opd reaches gap closed 0.5 in 15 optimiser steps; arm=grpo never does in its budget"]
