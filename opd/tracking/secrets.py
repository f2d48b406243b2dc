"""Secrets masked before anything reaches MLflow: params, tags, the run's name, the config artifact.

A value is a secret when its key says so (`api_key`, `password`, `secret`, `token`, `credentials`,
`auth`, `private_key`, `signature`, ... in any case and separator), when it is the password or user
of a URL (`https://user:pw@host`), a URL query parameter with such a name or named `key` or `sig`
(`?token=...`, `?key=...`, `&sig=...`), the argument of a command-line flag with such a name
(`[--api-key, sk-...]`, `--hf-token=...`, `--api-key VALUE` in text), or when it has the shape of a
well-known token (`sk-...`, `hf_...`, `ghp_...`, `xox?-...`, AWS key ids, Google API keys, JWTs,
`Bearer ...`). Hydra overrides are read as Hydra reads them (`[--api-key,VALUE]`,
`{HF_TOKEN:VALUE}`, sweeps of either), so what they hold is masked wherever it sits in the text.
Each secret is replaced by `MASK`; the rest of the text stays as it was.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"

# Words of a key that make its value a secret; pairs of consecutive words that do.
_SECRET_WORDS = {"password", "passwd", "pwd", "secret", "secrets", "token", "apikey", "credential", "credentials", "auth",
                 "authorization", "bearer", "cookie", "privatekey", "passphrase", "signature"}
# URL query parameters that hold a secret though their name alone would not say so in a config
# (Google's `?key=`, Azure's shared access `&sig=`).
_SECRET_QUERY_NAMES = {"key", "sig"}
_SECRET_PAIRS = {("api", "key"), ("private", "key"), ("access", "key"), ("secret", "key"), ("session", "key")}
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
# scheme://user:password@host or scheme://token@host (a password may hold `@` itself: it ends at
# the last `@` before the path). Each pattern starts only where its first part can (a scheme after
# no scheme character, a query name after no `?`), so a long run of letters is read once, not once
# per letter.
_USERINFO = re.compile(r"(?P<scheme>(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s]*)(?::(?P<password>[^/\s]*))?@")
_QUERY = re.compile(r"(?P<head>[?&;](?P<name>[^=&;#\s?]+)=)(?P<value>[^&;#\s'\"]*)")
# --api-key=VALUE (a flag and its value in one string)
_FLAG_VALUE = re.compile(r"^(?P<flag>--?[A-Za-z0-9_.-]+)=(?P<value>.*)$", re.DOTALL)
# A flag and its value in text: `--api-key=VALUE`, `--api-key VALUE`, `[--api-key,VALUE]`.
_FLAG_IN_TEXT = re.compile(r"(?P<flag>(?<![\w-])--?[A-Za-z][\w.-]*)(?P<sep>=|,\s*|\s+)(?P<value>'[^']*'|\"[^\"]*\"|[^\s,\]}'\"]+)")
_TOKEN_SHAPES = re.compile(
    r"\b(?:sk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|glpat-[A-Za-z0-9_-]{20,}|AIza[0-9A-Za-z_-]{35}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"
    r"|(?<=Bearer )[A-Za-z0-9._~+/=-]{8,}"
)


def secret_key(key: str) -> bool:
    """Does a key named `key` (its last dotted part counts) hold a secret?"""
    last = str(key).rsplit(".", 1)[-1].lstrip("-")
    words = [w for w in re.split(r"[^a-z0-9]+", _CAMEL.sub("_", last).lower()) if w]
    return any(w in _SECRET_WORDS for w in words) or any(pair in _SECRET_PAIRS for pair in zip(words, words[1:]))


def mask_text(text: str) -> str:
    """`text` with URL credentials, secret query parameters, the values of secret flags and
    token-shaped strings masked."""
    text = _USERINFO.sub(_masked_userinfo, text)
    text = _QUERY.sub(lambda m: m.group("head") + MASK if _secret_query(m.group("name")) and m.group("value") else m.group(0), text)
    text = _FLAG_IN_TEXT.sub(lambda m: m.group("flag") + m.group("sep") + MASK if secret_key(m.group("flag")) else m.group(0), text)
    return _TOKEN_SHAPES.sub(MASK, text)


def _secret_query(name: str) -> bool:
    return secret_key(name) or name.lower() in _SECRET_QUERY_NAMES


def _masked_userinfo(match: re.Match) -> str:
    if match.group("password") is not None:
        return f"{match.group('scheme')}{match.group('user')}:{MASK}@"
    return f"{match.group('scheme')}{MASK}@" if match.group("user") else match.group(0)


def mask_value(key: str, value: Any) -> Any:
    """`value` (of the config key `key`) with every secret in it masked; lists and dicts inside
    are masked item by item (a list item after a secret flag, such as `--api-key`, is a secret)."""
    if isinstance(value, dict):
        return {k: (MASK if secret_key(k) and v not in (None, "") else mask_value(k, v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out, after_flag = [], False
        for item in value:
            if after_flag and item not in (None, ""):
                out.append(MASK)
            else:
                out.append(mask_value(key, item))
            after_flag = isinstance(item, str) and item.startswith("-") and "=" not in item and secret_key(item)
        return out
    if secret_key(key) and value not in (None, ""):
        return MASK
    if isinstance(value, str):
        flag = _FLAG_VALUE.match(value)
        if flag and secret_key(flag.group("flag")):
            return f"{flag.group('flag')}={MASK}"
        return mask_text(value)
    return value


def mask_config(tree: dict[str, Any]) -> dict[str, Any]:
    """The resolved config with every secret masked (same shape, same keys)."""
    return mask_value("", tree)


def mask_params(params: dict[str, Any]) -> dict[str, Any]:
    """Flat `{dotted key: value}` params or tags with every secret masked."""
    return {key: mask_value(key, value) for key, value in params.items()}


def mask_overrides(overrides: list[str]) -> list[str]:
    """Hydra overrides (`key=value`, `+key=value`, `~key`) with secret values masked, also inside
    the lists, dicts and sweeps a value spells (`[--api-key,VALUE]`, `{HF_TOKEN:VALUE}`)."""
    out = []
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep:
            out.append(mask_text(override))
            continue
        name = key.lstrip("+~")
        out.append(f"{key}={mask_value(name, _mask_parsed(override, name, value))}")
    return out


def _mask_parsed(override: str, key: str, value: str) -> str:
    """`value` (the text of `override`'s value) with every secret Hydra reads in it masked where it
    is written; unchanged when Hydra cannot read it."""
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_override(override).value()
    except Exception:  # noqa: BLE001 - not an override Hydra reads: masked as text by the caller
        return value
    items = getattr(parsed, "list", None)  # a choice sweep: each of its values
    parsed = list(items) if isinstance(items, list) else parsed
    if not isinstance(parsed, (dict, list)):
        return value
    changes = _changed(parsed, mask_value(key, parsed))
    for original in sorted(changes, key=len, reverse=True):  # a longer text before any part of it
        value = value.replace(original, changes[original])
    return value


def _changed(original: Any, masked: Any) -> dict[str, str]:
    """{the text of a leaf of `original`: its text in `masked`} for each leaf that masking changed
    (`masked` is `original` masked; the whole value of a secret key is one MASK)."""
    if isinstance(original, dict) and isinstance(masked, dict):
        return {text: new for k in original for text, new in _changed(original[k], masked[k]).items()}
    if isinstance(original, (list, tuple)) and isinstance(masked, list):
        return {text: new for a, b in zip(original, masked) for text, new in _changed(a, b).items()}
    if original == masked:
        return {}
    if isinstance(original, (dict, list, tuple)):  # every leaf under a secret key
        leaves = original.values() if isinstance(original, dict) else original
        return {text: new for leaf in leaves for text, new in _changed(leaf, MASK).items()}
    return {str(original): str(masked)}


def mask_name(name: str) -> str:
    """A run's name made of `key=value` overrides (separated by spaces or commas) with secret values masked."""
    return mask_text(re.sub(r"(?P<key>[^\s,=]+)=(?P<value>[^\s,\]}]*)",
                            lambda m: f"{m.group('key')}={mask_value(m.group('key').lstrip('+~'), m.group('value'))}", name))
