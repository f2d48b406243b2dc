"""Which keys and values are secrets, and that masking leaves everything else as it was."""

from __future__ import annotations

import pytest

from opd.tracking.secrets import MASK, mask_config, mask_overrides, mask_text, mask_value, secret_key


@pytest.mark.parametrize("key", ["api_key", "server.api_key", "apiKey", "OPENAI_API_KEY", "hf_token", "token", "password", "db.passwd",
                                 "aws_secret_access_key", "client_secret", "credentials", "auth", "private_key", "--api-key", "--hf-token"])
def test_keys_that_hold_secrets(key: str) -> None:
    assert secret_key(key)


@pytest.mark.parametrize("key", ["max_tokens", "judge_max_tokens", "max_new_tokens", "required_tokens", "passed", "tokenizer", "distill_topk",
                                 "model.path", "server.base_urls", "keys", "hint_header", "monkey"])
def test_keys_that_do_not(key: str) -> None:
    assert not secret_key(key)


@pytest.mark.parametrize(("text", "masked"), [
    ("http://user:pw@host:8000/v1", f"http://user:{MASK}@host:8000/v1"),
    ("https://tok@host/x", f"https://{MASK}@host/x"),
    ("https://host/x?token=abc&page=2", f"https://host/x?token={MASK}&page=2"),
    ("https://host/x?page=2", "https://host/x?page=2"),
    ("key sk-abcdefghijklmnopqrstu in text", f"key {MASK} in text"),
    ("Authorization: Bearer abc.def.ghi123", f"Authorization: Bearer {MASK}"),
    ("hf_abcdefghijklmnopqrstuvwxyz", MASK),
    ("user@example.com wrote 3 tokens", "user@example.com wrote 3 tokens"),
])
def test_text_masks_credentials_and_token_shapes_only(text: str, masked: str) -> None:
    assert mask_text(text) == masked


def test_a_config_keeps_its_shape_and_every_other_value() -> None:
    config = {"server": {"api_key": "k", "max_tokens": 7, "extra_args": ["--api-key", "s", "--port", "8000", "--token=t"], "api_key_file": None},
              "judge": {"auth": {"user": "u", "password": "p"}, "base_url": "http://u:p@h/v1"}, "seed": 3}
    assert mask_config(config) == {
        "server": {"api_key": MASK, "max_tokens": 7, "extra_args": ["--api-key", MASK, "--port", "8000", f"--token={MASK}"], "api_key_file": None},
        "judge": {"auth": MASK, "base_url": f"http://u:{MASK}@h/v1"}, "seed": 3}
    assert mask_value("server.api_key", "") == ""  # nothing to hide: the empty value says it is unset


def test_overrides_and_run_names() -> None:
    assert mask_overrides(["server.api_key=abc", "+judge.password=x", "seed=1", "~tracking", "server.base_urls=[http://a:b@h/v1]"]) == [
        f"server.api_key={MASK}", f"+judge.password={MASK}", "seed=1", "~tracking", f"server.base_urls=[http://a:{MASK}@h/v1]"]


# Found by the fresh-eyes attack: Hydra's list and dict syntax on the command line, and a URL
# password holding `@`, went through mask_overrides (the command tag, the sweep parent's overrides
# tag, run names) as they were.
@pytest.mark.parametrize(("override", "masked"), [
    ("server.extra_args=[--api-key,s3cr3t]", f"server.extra_args=[--api-key,{MASK}]"),
    ("server.extra_args=[--port,8000,--api-key=s3cr3t]", f"server.extra_args=[--port,8000,--api-key={MASK}]"),
    ("server.extra_args=[--api-key,s3cr3t],[--api-key,other]", f"server.extra_args=[--api-key,{MASK}],[--api-key,{MASK}]"),
    ("+server.environment={HF_TOKEN:s3cr3t,HF_HOME:/data}", f"+server.environment={{HF_TOKEN:{MASK},HF_HOME:/data}}"),
    ("judge.auth={user:u,password:s3cr3t}", f"judge.auth={MASK}"),
    ("judge.base_url='http://u:p@ss@host:8000/v1'", f"judge.base_url='http://u:{MASK}@host:8000/v1'"),
    ("dataset.path=https://host/x?key=s3cr3t&page=2", f"dataset.path=https://host/x?key={MASK}&page=2"),
    ("dataset.path='https://a.blob.core.windows.net/c/x?sv=2022-11-02&sig=s3cr3t'", f"dataset.path='https://a.blob.core.windows.net/c/x?sv=2022-11-02&sig={MASK}'"),
    ("seed=1,2", "seed=1,2"),
    ("server.extra_args=[--port,8000]", "server.extra_args=[--port,8000]"),
    ("--multirun", "--multirun"),
])
def test_overrides_are_masked_as_hydra_reads_them(override: str, masked: str) -> None:
    assert mask_overrides([override]) == [masked]


@pytest.mark.parametrize(("text", "masked"), [
    ("vllm serve m --api-key s3cr3t --port 8000", f"vllm serve m --api-key {MASK} --port 8000"),
    ("[--hf-token,s3cr3t]", f"[--hf-token,{MASK}]"),
    ("key AIzaSyA1234567890abcdefghijklmnopqrstuv", f"key {MASK}"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", f"jwt {MASK}"),
    ("--port 8000 --max-tokens 5", "--port 8000 --max-tokens 5"),
])
def test_flags_and_token_shapes_in_text(text: str, masked: str) -> None:
    assert mask_text(text) == masked


@pytest.mark.parametrize("text", ["a" * 200_000, "?" * 200_000, "a-" * 100_000, "x://" + "a:" * 100_000])
def test_masking_reads_a_long_run_once(text: str) -> None:
    # A config value is masked before the run starts: a 32,000-letter run took 1 s, 200,000 ~40 s.
    import time

    started = time.process_time()
    mask_text(text)
    assert time.process_time() - started < 0.5
