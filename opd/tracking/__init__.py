"""MLflow: the run (`run`: opening, tagging, logging and closing it) and traces (`traces`)."""
