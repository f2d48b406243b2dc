"""Records: assembling, checking, writing and reading back one large group, plain and gzip."""

from __future__ import annotations

import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any, Iterator

from experiments.bench.common import median


def _synthetic_group(tokens: int, k: int, sequences: int = 4) -> dict[str, Any]:
    """A group like opd_coding writes: 1/4 prompt (masked), 3/4 generated with teacher rows
    (random ids and full-precision logprobs, so compression sees realistic entropy)."""
    import random

    from opd.records import DISTILL_PAD_ID, DISTILL_PAD_LOGPROB, MASK, MASKED_LOGPROB

    rng = random.Random(tokens)
    prompt = tokens // 4
    group: dict[str, Any] = {"tokens": [], "masks": [], "scores": [], "inference_logprobs": [], "distill_token_ids": [], "distill_logprobs": [],
                             "overrides": [], "group_overrides": {"item_id": "bench"}, "messages": None, "advantages": None, "ref_logprobs": None, "generation_params": {}}
    for _ in range(sequences):
        ids = [rng.randrange(150_000) for _ in range(tokens)]
        group["tokens"].append(ids)
        group["masks"].append([MASK] * prompt + ids[prompt:])
        group["inference_logprobs"].append([MASKED_LOGPROB] * prompt + [-rng.expovariate(2.0) for _ in range(tokens - prompt)])
        rows = [sorted(rng.sample(range(150_000), k)) for _ in range(tokens - prompt)]
        group["distill_token_ids"].append([[DISTILL_PAD_ID] * k for _ in range(prompt)] + rows)
        lps = [sorted((-rng.expovariate(0.5) for _ in range(k)), reverse=True) for _ in range(tokens - prompt)]
        group["distill_logprobs"].append([[DISTILL_PAD_LOGPROB] * k for _ in range(prompt)] + lps)
        group["scores"].append(rng.random())
        group["overrides"].append({"teacher_logprobs": [None] * prompt + [-rng.expovariate(2.0) for _ in range(tokens - prompt)]})
    return group


def bench_records(repeats: int, k: int = 50, sizes: tuple[int, ...] = (2048, 4096, 8192, 16384), overrides: tuple[str, ...] = ()) -> Iterator[dict[str, Any]]:
    """Assemble, check and write one group of 4 x N tokens with K distill rows; plain and gzip."""
    from opd.records import GroupWriter, check_group, read_groups

    with tempfile.TemporaryDirectory() as tmp:
        for tokens in sizes:
            group = _synthetic_group(tokens, k)
            for suffix in (".jsonl", ".jsonl.gz"):
                check, write, read = [], [], []
                size = 0
                # Peak memory of checking + writing (tracemalloc slows Python down: its own pass).
                tracemalloc.start()
                with GroupWriter(Path(tmp) / f"mem{tokens}{suffix}") as writer:
                    check_group(group)
                    writer.write(group)
                peak = tracemalloc.get_traced_memory()[1] / 2**20
                tracemalloc.stop()
                for r in range(repeats):
                    t1 = time.perf_counter()
                    problems = check_group(group)
                    t2 = time.perf_counter()
                    path = Path(tmp) / f"g{tokens}-{r}{suffix}"
                    with GroupWriter(path) as writer:
                        writer.write(group)
                    t3 = time.perf_counter()
                    assert not problems, problems
                    t4 = time.perf_counter()
                    (back,) = list(read_groups(path))
                    read.append(time.perf_counter() - t4)
                    assert back["distill_token_ids"] == group["distill_token_ids"]
                    check.append(t2 - t1)
                    write.append(t3 - t2)
                    size = path.stat().st_size
                    del back
                yield {
                    "bench": "records", "tokens_per_sequence": tokens, "sequences": 4, "k": k, "encoding": "gzip" if suffix.endswith(".gz") else "jsonl",
                    "check_s": median(check), "write_s": median(write), "read_s": median(read),
                    "peak_mib": peak, "bytes": size, "write_ns_per_value": 1e9 * median(write) / (4 * tokens * 2 * k),
                }
            del group
