"""What one run says about itself (opd/experiment.py): the model in its name and the table it ends with."""

from __future__ import annotations

import math
from pathlib import Path

from conftest import ROOT, compose
from opd.config import validate
from opd.experiment import summary_table
from opd.tracking.mlflow_run import model_label


def test_a_run_with_a_model_path_is_named_by_its_preset_or_checkpoint() -> None:
    assert model_label(validate(compose([]))) == "fixture"
    assert model_label(validate(compose([f"server.model={ROOT / 'opd' / 'fixture' / 'model'}"]))) == "fixture"
    assert model_label(validate(compose(["model=qwen3"]))) == "qwen3"
    assert model_label(validate(compose(["model=qwen3", "server.model=/models/Qwen3-4B-sft/"]))) == "Qwen3-4B-sft"


def test_the_end_of_a_run_is_a_small_table_of_what_it_did_and_where_it_is(tmp_path: Path) -> None:
    (tmp_path / "groups.jsonl").write_text("{}\n")
    (tmp_path / "launch.log").write_text("")
    report = {"summary/groups_written": 10.0, "summary/groups_failed": 1.0, "summary/groups_dropped": 0.0, "summary/groups_per_s": 0.045,
              "summary/reward_mean": 0.2864, "summary/server_request_errors": 0.0, "summary/server_request_retries": 2.0,
              "summary/server_requests_cancelled": 1.0, "summary/server_reconnects": 3.0, "accuracy": 0.125, "objective": 0.125, "objective_name": "accuracy", "run_s": 438.4,
              "output_dir": str(tmp_path), "mlflow_run_id": "abc123", "mlflow_experiment_id": "4", "tracking_uri": "sqlite:////o/mlflow.db"}
    lines = summary_table(validate(compose(["env=opd_coding"])), report).splitlines()
    assert lines[0] == "finished:"
    rows = {line.split()[0]: line.split(None, 1)[1].strip() for line in lines[1:]}
    assert rows["run"] == "train opd_coding on fixture in 438 s"
    assert rows["groups"] == "10 written, 1 failed, 0 dropped (0.045 groups/s)"
    assert rows["reward"] == "0.2864 (mean)" and rows["accuracy"] == "0.125" and rows["objective"] == "0.125 (accuracy)"
    assert rows["requests"] == "0 failed for good, 2 retried, 1 cut off by the run's end, 3 sent again on a new connection"
    assert rows["data"] == f"{tmp_path / 'groups.jsonl'} (browse: {tmp_path / 'groups.html'})" and rows["log"] == str(tmp_path / "launch.log")
    # A link in the UI's machine-learning view, at the address the command given beside it serves.
    assert rows["MLflow"] == ("run abc123 in experiment opd_coding: http://127.0.0.1:5000/#/experiments/4/runs/abc123?workflowType=machine_learning "
                              "(mlflow ui --backend-store-uri sqlite:////o/mlflow.db)")
    # A tracking server: its own address.
    served = summary_table(validate(compose(["env=opd_coding"])), {**report, "tracking_uri": "http://user:pw@mlflow.lab:8080"}).splitlines()
    assert any(line.split(None, 1)[1].strip() == "run abc123 in experiment opd_coding: http://mlflow.lab:8080/#/experiments/4/runs/abc123"
               "?workflowType=machine_learning" for line in served if line.strip().startswith("MLflow"))
    # An evaluation writes no groups; an accuracy that was never measured is a dash, not nan.
    unmeasured = {**{k: v for k, v in report.items() if not k.startswith("summary/")}, "accuracy": math.nan, "mlflow_run_id": None}
    evaluated = summary_table(validate(compose(["mode=evaluate"])), unmeasured)
    assert "  groups " not in evaluated and "accuracy   –" in evaluated and "MLflow" not in evaluated
