"""Where written groups go: one small interface (`base.Sink`) and its kinds: the JSONL file
(`jsonl`), MLflow metrics and data artifacts (`mlflow`), the Atropos trainer API (`atropos`)."""
