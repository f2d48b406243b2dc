"""Checkpoints with an output layer of their own, so that an in-place reload refreshes all of it.

A model that ties its output layer to its input embedding (the fixture; Qwen2.5 0.5-3B, Qwen3
0.6-4B) has no `lm_head.weight` in its checkpoint: vLLM builds the output layer from the embedding
at load, and `reload_weights` from such a checkpoint never rebuilds it (vLLM 0.32's CPU backend
keeps a packed copy made at load): after a refresh the server runs the new body with the old
output layer. Measured on the fixture: 0.270 nats from the new weights on the refresh probe, 0.016
from "new body + old output layer". A checkpoint with the output layer as a tensor of its own
(`tie_word_embeddings: false`, the same values) reloads whole: 0.014, the noise floor, into a
server that loaded the tied model or an untied copy alike. The trainer saves such checkpoints, and
a closed loop's server loads an untied copy, so that it holds the layout of every checkpoint it
reloads whatever a loader does with `lm_head.weight` under a tied config.

- `output_layer_tied(model)`: whether a loaded model shares its output layer with its embedding;
- `save_untied(model, directory)`: a HF checkpoint of `model` whose output layer is its own tensor;
- `untied_copy(model_dir, directory)`: such a copy of a checkpoint, for a server to start on
  (None when the checkpoint is untied already).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from opd.run_files import check_tree, lstat_kind, read_text, replace_file

logger = logging.getLogger(__name__)

# Files of a checkpoint directory that hold weights or describe them; the rest (tokenizer, chat
# template, generation config) is copied beside an untied copy unchanged.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def output_layer_tied(model: Any) -> bool:
    """Whether `model`'s output layer is its input embedding (one tensor, two names)."""
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or embedding is None:
        return False
    return head.weight is embedding.weight or head.weight.data_ptr() == embedding.weight.data_ptr()


def checkpoint_tied(model_dir: str) -> bool:
    """Whether the checkpoint at `model_dir` ties its output layer to its embedding, by its config
    (transformers' default where the config does not say)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)))


def _module_name(model: Any, module: Any) -> str:
    for name, candidate in model.named_modules():
        if candidate is module:
            return name
    raise ValueError(f"{type(model).__name__} does not hold its own output layer as a named module")


def untied_state_dict(model: Any) -> dict[str, Any]:
    """Every tensor of `model` under its own name, the output layer as a copy of its own where it
    is tied (safetensors refuses two names for one storage, and HF would drop the second)."""
    state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    if output_layer_tied(model):
        key = f"{_module_name(model, model.get_output_embeddings())}.weight"
        state[key] = state[key].clone()
    return state


def _untied_config(model: Any) -> Any:
    config = copy.deepcopy(model.config)
    config.tie_word_embeddings = False
    if hasattr(config, "get_text_config") and config.get_text_config() is not config:
        config.get_text_config().tie_word_embeddings = False
    return config


def save_untied(model: Any, directory: Path, max_shard_size: str = "5GB") -> Path:
    """Write `model` as a HF checkpoint whose output layer is a tensor of its own
    (`tie_word_embeddings: false`): same values, loads in transformers and vLLM alike, and an
    in-place reload refreshes every tensor. Weights only (config, generation config); the caller
    adds the tokenizer files. Earlier weight files in `directory` are replaced. The writers open
    files by name, so `directory` and all in it must be directories and regular files of their
    own (`opd.run_files.check_tree`: a link or a FIFO planted in a run directory is refused)."""
    from huggingface_hub import save_torch_state_dict

    check_tree(directory)
    for old in list(directory.iterdir()):
        if old.name.endswith(_WEIGHT_SUFFIXES) or old.name in _WEIGHT_INDEXES:
            old.unlink()
    save_torch_state_dict(untied_state_dict(model), directory, max_shard_size=max_shard_size, metadata={"format": "pt"})
    _untied_config(model).save_pretrained(directory)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(directory)
    return directory


def untied_copy(model_dir: str, directory: Path) -> Path | None:
    """An untied copy of the checkpoint at `model_dir` (a directory or a hub name) in `directory`,
    with its tokenizer and other files; None when its output layer is its own already. The copy
    keeps the checkpoint's dtype. A copy already there for the same source is reused."""
    if not checkpoint_tied(model_dir):
        return None
    marker = directory / "untied_from.json"
    source = {"model": str(Path(model_dir).resolve()) if Path(model_dir).is_dir() else model_dir}
    if Path(model_dir).is_dir():
        source["mtime"] = max(p.stat().st_mtime for p in Path(model_dir).iterdir())
    if os.path.lexists(marker) and lstat_kind(marker) is None and json.loads(read_text(marker, limit=1 << 16)) == source:
        return directory
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    save_untied(model, directory)
    if Path(model_dir).is_dir():
        for path in Path(model_dir).iterdir():
            keep = path.is_file() and not path.name.endswith(_WEIGHT_SUFFIXES) and path.name not in (*_WEIGHT_INDEXES, "config.json", "generation_config.json")
            if keep:
                shutil.copy2(path, directory / path.name)
    else:
        AutoTokenizer.from_pretrained(model_dir).save_pretrained(directory)
    replace_file(marker, json.dumps(source))
    logger.info("the output layer of %s is tied to its embedding: serving an untied copy (%s), which an in-place reload refreshes whole",
                model_dir, directory)
    return directory


def main(argv: list[str] | None = None) -> int:
    """`python -m opd.train.untied MODEL DIR`: write an untied copy of MODEL for a server that a
    closed loop refreshes in place (server=vllm; server=local makes its own)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m opd.train.untied", description=main.__doc__.split("\n")[0] if main.__doc__ else None)
    parser.add_argument("model", help="a checkpoint directory or hub name")
    parser.add_argument("out", type=Path, help="where the untied copy goes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    copy_dir = untied_copy(args.model, args.out)
    if copy_dir is None:
        logger.info("%s has an output layer of its own already: serve it as it is", args.model)
    else:
        logger.info("serve %s (e.g. vllm serve %s --served-model-name %s ...)", copy_dir, copy_dir, args.model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
