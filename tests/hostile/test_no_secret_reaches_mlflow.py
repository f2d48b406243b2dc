"""No secret of the config or the command line reaches MLflow (docs/guarantees.md, "Untrusted text")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ROOT, compose
from opd.config import validate

# The leftover check (hostile/conftest.py) scans the whole machine: these tests run on one xdist worker.
pytestmark = pytest.mark.xdist_group("hostile")

# ---- no secret reaches MLflow ---------------------------------------------------

SECRETS = {
    "server.api_key": "opd-secret-server-key-1",
    "judge.api_key": "opd-secret-judge-key-2",
    "url_password": "opd-secret-url-password-3",
    "url_token": "opd-secret-url-token-4",
    "flag": "sk-opdsecretflagvalue5555555",
    "flag_inline": "opd-secret-inline-flag-6",
    "hf": "hf_opdsecrethubtoken7777777777777",
}


@pytest.mark.slow
def test_secrets_in_the_config_never_reach_mlflow(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from opd.tracking.mlflow_run import DatasetRef, RunInfo, open_run

    cfg = validate(compose([
        "env=opd_coding", "judge=server", "judge.model=judge", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", "tracking.experiment=secrets",
        f"server.api_key={SECRETS['server.api_key']}", f"judge.api_key={SECRETS['judge.api_key']}",
        f"judge.base_url='http://opd:{SECRETS['url_password']}@judge-host:8000/v1'",
        "dataset=coding_local", f"dataset.path='https://data-host/set.jsonl?token={SECRETS['url_token']}'",
        f"server.extra_args=[--api-key,{SECRETS['flag']},'--hf-token={SECRETS['flag_inline']}']",
        f"env.system_prompt=use the hub token {SECRETS['hf']}",
    ]))
    resolved = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    # Swept values name the run and are params; tags and a dataset source may hold URLs too.
    info = RunInfo(f"server.api_key={SECRETS['server.api_key']},seed=1", None, None,
                   {"server": f"http://opd:{SECRETS['url_password']}@gpu-a:8000/v1"}, {"server.api_key": SECRETS["server.api_key"]},
                   ("remote", DatasetRef("local", f"https://opd:{SECRETS['url_password']}@data-host/set.jsonl", None, "train", "remote set"), [{"id": 1}], "train"))
    with open_run(cfg.tracking, tmp_path, resolved, info) as tracker:
        tracker.set_tags({"judge_url": f"http://judge-host:8000/v1?api_key={SECRETS['url_token']}"})
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("secrets").experiment_id])
    config_yaml = Path(client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path))).read_text()
    logged = json.dumps([run.data.params, run.data.tags, run.info.run_name, [str(i.dataset) for i in run.inputs.dataset_inputs]]) + config_yaml
    leaked = [name for name, secret in SECRETS.items() if secret in logged]
    assert leaked == [], leaked
    assert run.data.params["server.api_key"] == "***" and run.data.params["judge.api_key"] == "***"
    assert run.data.params["judge.base_url"] == "http://opd:***@judge-host:8000/v1"
    assert run.data.params["dataset.path"] == "https://data-host/set.jsonl?token=***"
    assert run.data.params["server.max_requests_in_flight"] == str(cfg.server.max_requests_in_flight)  # the rest as it was
    assert "api_key: '***'" in config_yaml and "--api-key" in config_yaml


# The command line as typed: Hydra's list, dict and sweep syntax and a URL password holding `@`
# reached the command tag, the run's name and a sweep parent's name and overrides tag as typed.
TYPED_SECRETS = {
    "list_flag": "opd-secret-list-flag-8",
    "list_flag_inline": "opd-secret-list-inline-9",
    "dict_value": "opd-secret-dict-value-10",
    "url_at_password": "opd-secret-p@ss-11",
    "query_key": "opd-secret-query-key-12",
    "swept_flag": "opd-secret-swept-flag-13",
}
TYPED = [
    "total_steps=3",
    f"server.extra_args=[--port,8000,--api-key,{TYPED_SECRETS['list_flag']},--hf-token={TYPED_SECRETS['list_flag_inline']}]",
    f"+server.environment={{HF_TOKEN:{TYPED_SECRETS['dict_value']},HF_HOME:/data}}",
    f"judge.base_url='http://opd:{TYPED_SECRETS['url_at_password']}@judge-host:8000/v1'",
    f"dataset.path='https://data-host/set.jsonl?key={TYPED_SECRETS['query_key']}'",
    f"+judge.extra_args=[--api-key,{TYPED_SECRETS['swept_flag']}],[--api-key,x{TYPED_SECRETS['swept_flag']}]",
]


@pytest.mark.slow
def test_secrets_typed_on_the_command_line_never_reach_mlflow(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from opd.tracking.mlflow_run import RunInfo, open_run, run_title, source_tags
    from opd.tracking.secrets import mask_overrides

    cfg = validate(compose(["env=opd_coding", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", "tracking.experiment=typed"]))
    resolved = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    argv = [str(ROOT / "experiments" / "launch.py"), *TYPED]
    # What opd.experiment makes of the command line for a run, and the sweep callback for a sweep's parent.
    info = RunInfo(run_title("opd_coding", "fixture", TYPED), None, None, {}, {}, None, source=source_tags(argv))
    parent = {"name": "sweep " + run_title("opd_coding", "fixture", TYPED), "opd.overrides": " ".join(mask_overrides(TYPED)), **source_tags(argv)}
    with open_run(cfg.tracking, tmp_path, resolved, info):
        pass
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("typed").experiment_id])
    logged = json.dumps([run.data.params, run.data.tags, run.info.run_name, parent])
    leaked = [name for name, secret in TYPED_SECRETS.items() if secret in logged or secret.split("@")[-1] in logged]
    assert leaked == [], leaked
    assert "--port,8000" in run.data.tags["opd.command"] and "HF_HOME:/data" in run.data.tags["opd.command"]  # the rest as typed
    assert "total_steps=3" in run.info.run_name and "total_steps=3" in parent["name"]
