"""The model's Hugging Face tokenizer: the one `AutoTokenizer` (and so vLLM's server) loads,
unless that one's ids differ from the model's own `tokenizer.json` (then the files as written),
without `AutoTokenizer`'s start-up cost after the first time.

The class `AutoTokenizer` picks can tokenize differently from the `tokenizer.json` the model was
released with: with transformers 5, the DeepSeek-R1 distills' files name `LlamaTokenizerFast`, and
the Llama class rebuilds its own pre-tokenizer ("Who are you?" -> [15191, 546, 9330, 30] instead
of [15191, 525, 498, 30]). So the ids of a few probe strings are compared with
`PreTrainedTokenizerFast` (the `tokenizer.json` as written); where they differ, that class is used.

`AutoTokenizer` imports transformers' model registry, which imports torch and scikit-learn: about
4 s before the first prompt can be built. Which class it picks is not simply the one that
`tokenizer_config.json` names (the model type can override it: the fixture names
`PreTrainedTokenizerFast` and gets `Qwen2Tokenizer`, which builds its own pre-tokenizer). So the
class `AutoTokenizer` picked for a local model directory is remembered, keyed by the files it
decided from and the transformers version, in `$OPD_CACHE_DIR` (default
`~/.cache/opd`)/tokenizer_classes.json; a later load of the same files uses that class directly
(transformers' tokenizer modules import in under a second). Hub names and directories seen
for the first time go through `AutoTokenizer`.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# The files AutoTokenizer's choice of class depends on.
_DECIDING_FILES = ("tokenizer_config.json", "config.json", "tokenizer.json")


def cache_file() -> Path:
    """Where the classes AutoTokenizer picked are remembered."""
    root = os.environ.get("OPD_CACHE_DIR")
    if not root:
        try:
            base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        except RuntimeError:  # no home directory: the temporary directory's
            base = tempfile.gettempdir()
        root = os.path.join(base, "opd")
    return Path(root) / "tokenizer_classes.json"


def _key(directory: Path) -> str | None:
    """The identity of a local model directory's deciding files (None: not a local directory)."""
    if not directory.is_dir() or not (directory / "tokenizer_config.json").is_file():
        return None
    from importlib.metadata import version

    parts = [str(directory.resolve()), version("transformers")]
    for name in _DECIDING_FILES:
        try:
            stat = (directory / name).stat()
            parts.append(f"{name}:{stat.st_size}:{stat.st_mtime_ns}")
        except FileNotFoundError:
            parts.append(f"{name}:-")
    return "|".join(parts)


def _read_cache() -> dict[str, str]:
    try:
        found = json.loads(cache_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _remember(key: str, class_name: str) -> None:
    """Record AutoTokenizer's class for `key` (atomically; a cache that cannot be written is skipped)."""
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        known = _read_cache()
        known[key] = class_name
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".tokenizer_classes.", delete=False, encoding="utf-8") as tmp:
            json.dump(known, tmp, indent=0)
        os.replace(tmp.name, path)
    except OSError as err:
        logger.warning("tokenizer class cache %s not written (each start-up pays AutoTokenizer's import): %s", path, err)


def remembered_class(name_or_path: str) -> type | None:
    """The class AutoTokenizer picked for these exact files before (None: not known)."""
    return _class_for(_key(Path(name_or_path)))


def _class_for(key: str | None) -> type | None:
    name = _read_cache().get(key) if key is not None else None
    if not isinstance(name, str) or not name.isidentifier():
        return None
    import transformers

    found = getattr(transformers, name, None)
    return found if isinstance(found, type) and hasattr(found, "from_pretrained") else None


# Text whose ids tell a tokenizer that rebuilt its pre-tokenizer from the one its files describe.
PROBES = ("Who are you?", "def f(x):\n    return x  + 1\n\n", "héllo wörld 12345 ...!!", "  leading spaces\tand\ttabs")


def load_tokenizer(name_or_path: str) -> Any:
    """The tokenizer of `name_or_path` (a local directory or a hub name): `AutoTokenizer`'s, or
    `PreTrainedTokenizerFast` where `AutoTokenizer`'s class gives other ids than the files' own
    `tokenizer.json` (see the module docstring)."""
    key = _key(Path(name_or_path))
    cls = _class_for(key)
    if cls is not None:
        return cls.from_pretrained(name_or_path)
    import transformers
    from transformers import AutoTokenizer

    tokenizer = as_written(name_or_path, AutoTokenizer.from_pretrained(name_or_path))
    # Only a class transformers exports under its own name can be loaded directly next time.
    if key is not None and getattr(transformers, type(tokenizer).__name__, None) is type(tokenizer):
        _remember(key, type(tokenizer).__name__)
    return tokenizer


def as_written(name_or_path: str, tokenizer: Any) -> Any:
    """`tokenizer`, or the files' `tokenizer.json` loaded as written when its ids differ."""
    from transformers import PreTrainedTokenizerFast

    if isinstance(tokenizer, PreTrainedTokenizerFast) and type(tokenizer).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend"):
        return tokenizer
    try:
        written = PreTrainedTokenizerFast.from_pretrained(name_or_path)
    except (OSError, ValueError, TypeError):  # no tokenizer.json (a sentencepiece-only model): nothing to compare
        return tokenizer
    if all(written.encode(p, add_special_tokens=False) == tokenizer.encode(p, add_special_tokens=False) for p in PROBES):
        return tokenizer
    logger.warning("%s: %s tokenizes differently from the model's tokenizer.json; using the tokenizer.json as written "
                   "(PreTrainedTokenizerFast)", name_or_path, type(tokenizer).__name__)
    return written
