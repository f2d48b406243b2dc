"""Where written groups go: one small interface (`base.Sink`), the sinks by name (`registry`:
the config's `sinks` list) and their kinds: the JSONL file (`jsonl`), MLflow metrics and data
artifacts (`mlflow`), the Atropos trainer API (`atropos`), the local trainer (`trainer`), the
held-out evaluation (`evaluation`) and the records as a dataset (`parquet`, optional)."""
