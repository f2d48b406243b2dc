"""Where `server.model` is found: a local directory, or a hub name that is cached or downloadable.

Checked before any server starts, so that a model that cannot be had fails in seconds with one
line naming `server.model` and what to do, instead of vLLM's traceback a minute later. The
user's own hub settings (`HF_HUB_OFFLINE`, `HF_HOME`, `HF_TOKEN`, ...) are what count: the run
never changes them.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from opd.config import ConfigError

logger = logging.getLogger(__name__)

# owner/name as the hub spells a model id (a bare name is an old-style id).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
# Seconds the hub may take to answer whether the model exists.
HUB_TIMEOUT_S = 10.0


class ModelNotFound(ConfigError):
    """`server.model` names no local directory and no model the hub gives this user."""

    def __init__(self, message: str, key: str = "server.model") -> None:
        super().__init__(message, key)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def find_model(name: str, key: str = "server.model") -> str:
    """`name` when it is a local model directory, a hub model in the local cache, or a hub model
    this user can download now; else `ModelNotFound` saying which and what to do."""
    path = Path(name).expanduser()
    if path.is_dir():
        return name
    if path.exists():
        raise ModelNotFound(f"{key}={name!r} is a file, not a model directory: give the directory that holds config.json and the tokenizer", key)
    if name.startswith(("/", ".", "~")) or not _HUB_ID.match(name):
        raise ModelNotFound(f"{key}={name!r}: no such directory; give an existing model directory or a hub name such as Qwen/Qwen3-4B", key)
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return name
    if _offline():
        raise ModelNotFound(f"{key}={name!r} is not a local directory nor in the Hugging Face cache ({constants.HF_HUB_CACHE}), and HF_HUB_OFFLINE is set: "
                            f"download it first (huggingface-cli download {name}), unset HF_HUB_OFFLINE, or give a local model directory", key)
    return _reachable(name, key)


def _reachable(name: str, key: str) -> str:
    """`name` when the hub answers for it within `HUB_TIMEOUT_S`."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(name, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise ModelNotFound(f"{key}={name!r} is gated on the Hugging Face hub: accept its licence on its page and log in (huggingface-cli login or HF_TOKEN), "
                            "or give a local model directory", key) from None
    except RepositoryNotFoundError:
        raise ModelNotFound(f"{key}={name!r}: the Hugging Face hub has no such model (or it is private and HF_TOKEN is not set): check the name, "
                            "or give a local model directory", key) from None
    except Exception as err:  # connection refused, DNS, proxy, timeout: the hub cannot be reached from here
        reason = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise ModelNotFound(f"{key}={name!r}: the Hugging Face hub cannot be reached ({reason}): give a local model directory, "
                            "or run where the hub is reachable", key) from None
    return name
