"""Where a run's MLflow data goes, decided by `tracking.uri` alone, and a cheap check of it.

- A sqlite store keeps its artifacts beside its database file (`<db dir>/mlruns`), so a run
  pointed at another file never writes into this checkout's `outputs/`.
- An MLflow server (`http(s)://`) keeps them in its own artifact store (`mlflow server` serves
  them by default: the experiment's location is `mlflow-artifacts:/...`, uploads go through it).
- Other stores keep MLflow's own default (a file store: inside its root); a database other than
  sqlite has no place of its own, so it needs `tracking.artifact_root`.
- An explicit `tracking.artifact_root` always wins (relative paths are made absolute).

`check_store` runs before any server starts and without importing MLflow (seconds of imports)
for sqlite and http(s) URIs; other schemes are opened with MLflow itself.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from opd.config import ConfigError

SQLITE = "sqlite:///"
# Database stores that hold no artifacts and have no directory to put them beside.
_DATABASES = ("postgresql", "mysql", "mssql")


def absolute_tracking_uri(uri: str) -> str:
    """sqlite:///relative/path -> sqlite:////abs/path, so the store is the same from any process."""
    if uri.startswith(SQLITE) and not uri.startswith(SQLITE + "/"):
        path = Path(uri[len(SQLITE) :]).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return SQLITE + str(path)
    return uri


def _scheme(uri: str) -> str:
    return urlparse(uri).scheme.split("+", 1)[0].lower()


def sqlite_path(uri: str) -> Path | None:
    """The database file of a sqlite URI (None for other URIs and in-memory databases)."""
    if not uri.startswith(SQLITE):
        return None
    path = uri[len(SQLITE) :].split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path).resolve()


def artifact_location(uri: str, artifact_root: str | None) -> str | None:
    """Where new experiments keep their artifacts (None: the store's own default); see the
    module docstring."""
    if artifact_root:
        return artifact_root if "://" in artifact_root else Path(artifact_root).resolve().as_uri()
    db = sqlite_path(uri)
    if db is not None:
        return (db.parent / "mlruns").as_uri()
    if _scheme(uri) in _DATABASES:
        raise ConfigError(
            f"tracking.artifact_root: a {_scheme(uri)} store holds no artifacts; set tracking.artifact_root to a "
            "location every job can reach, or point tracking.uri at an MLflow server", "tracking.artifact_root")
    return None


def check_store(uri: str, artifact_root: str | None, timeout_s: float = 10.0) -> None:
    """Fail with a ConfigError naming `tracking.uri` when the store cannot be used: cheaply for
    sqlite (the directory, an existing file's header) and http(s) (the server answers as MLflow),
    by opening it with MLflow for any other scheme."""
    artifact_location(uri, artifact_root)
    uri = absolute_tracking_uri(uri) if uri.startswith(SQLITE) else uri
    scheme = _scheme(uri)
    try:
        if scheme == "sqlite":
            _check_sqlite(uri)
        elif scheme in ("http", "https"):
            _check_server(uri, timeout_s)
        else:
            _check_with_mlflow(uri)
    except ConfigError:
        raise
    except Exception as err:  # MLflow raises many types for a bad or unreachable store
        raise store_error(uri, err) from err


def store_error(uri: str, err: BaseException) -> ConfigError:
    return ConfigError(f"tracking.uri: cannot open the MLflow store {uri!r}: {type(err).__name__}: {str(err)[:300]}", "tracking.uri")


def _check_sqlite(uri: str) -> None:
    db = sqlite_path(uri)
    if db is None:
        return
    if not db.parent.is_dir():
        db.parent.mkdir(parents=True, exist_ok=True)
    if not os.access(db.parent, os.W_OK):
        raise ConfigError(f"tracking.uri: cannot write the MLflow store's directory {db.parent}", "tracking.uri")
    if db.exists():
        # Raises for a file that is not a database; waits for another writer (a sweep's jobs).
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as conn:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()


def _check_server(uri: str, timeout_s: float) -> None:
    """The server answers MLflow's REST API (any answer but 404: auth is MLflow's to handle)."""
    url = uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1"
    context = None
    if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
        context = ssl._create_unverified_context()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context):
            return
    except urllib.error.HTTPError as err:
        if err.code == 404:
            raise ConfigError(f"tracking.uri: {uri} answers, but not as an MLflow tracking server (404 for {url})", "tracking.uri") from err
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise ConfigError(f"tracking.uri: cannot reach the MLflow server {uri}: {reason}", "tracking.uri") from err


def _check_with_mlflow(uri: str) -> None:
    import mlflow

    mlflow.MlflowClient(uri).search_experiments(max_results=1)
