"""Tokenizers of each model family's shape, built in the test (no hub): byte-level, no merges (so
any text round-trips exactly and a marker that is not a token is split into bytes), carrying the
family's special tokens, with a chat template of the family's shape (system, user, assistant, tool
turns; tools rendered where the family renders them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

_TOOLS_JSON = "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"

CHATML = (
    "{% if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\n<tools>\n" + _TOOLS_JSON + "</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags.<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' or (message.role == 'system' and not loop.first) %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'tool' %}{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)

LLAMA3 = (
    "<|begin_of_text|>"
    "{% if messages[0].role == 'system' %}{% set system = messages[0].content %}{% set rest = messages[1:] %}"
    "{% else %}{% set system = '' %}{% set rest = messages %}{% endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\n{% if tools %}Environment: ipython\n{% endif %}{{ system }}<|eot_id|>"
    "{% for message in rest %}"
    "{% if message.role == 'user' %}<|start_header_id|>user<|end_header_id|>\n\n"
    "{% if tools and loop.first %}Given the following functions, respond with a JSON for a function call with its proper arguments "
    "that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary of argument name "
    "and its value}.\n\n" + _TOOLS_JSON + "\n{% endif %}{{ message.content }}<|eot_id|>"
    "{% elif message.role == 'assistant' %}<|start_header_id|>assistant<|end_header_id|>\n\n{{ message.content }}<|eot_id|>"
    "{% elif message.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n{{ message.content }}<|eot_id|>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

MISTRAL = (
    "<s>{% if tools %}[AVAILABLE_TOOLS][{% for tool in tools %}{{ tool | tojson }}{% if not loop.last %}, {% endif %}{% endfor %}]"
    "[/AVAILABLE_TOOLS]{% endif %}"
    "{% if messages[0].role == 'system' %}{% set system = messages[0].content + '\n\n' %}{% set rest = messages[1:] %}"
    "{% else %}{% set system = '' %}{% set rest = messages %}{% endif %}"
    "{% for message in rest %}"
    "{% if message.role == 'user' %}[INST] {% if loop.first %}{{ system }}{% endif %}{{ message.content }}[/INST]"
    "{% elif message.role == 'assistant' %}{{ message.content }}</s>"
    "{% elif message.role == 'tool' %}[TOOL_RESULTS]{\"content\": {{ message.content | tojson }}}[/TOOL_RESULTS]"
    "{% endif %}{% endfor %}"
)

# The DeepSeek-R1 distills' shape: the stock template ignores `tools` (R1_STOCK); R1_TOOLS is
# what a user supplies (model.chat_template) so that they reach the model.
_R1_BODY = (
    "{% for message in messages %}"
    "{% if message.role == 'user' %}<｜User｜>{{ message.content }}"
    "{% elif message.role == 'assistant' %}<｜Assistant｜>{{ message.content }}<｜end▁of▁sentence｜>"
    "{% elif message.role == 'tool' %}<｜User｜><tool_response>\n{{ message.content }}\n</tool_response>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"
)
R1_STOCK = "<｜begin▁of▁sentence｜>{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}" + _R1_BODY
R1_TOOLS = (
    "<｜begin▁of▁sentence｜>{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}"
    "{% if tools %}\n\nTools (call one as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>):\n" + _TOOLS_JSON + "{% endif %}"
    + _R1_BODY
)


@dataclass(frozen=True)
class Family:
    special: tuple[str, ...]  # special tokens (skipped by skip_special_tokens)
    added: tuple[str, ...]  # ordinary added tokens (kept as text)
    eos: str
    template: str


FAMILIES = {
    "qwen3": Family(("<|im_start|>", "<|im_end|>", "<|endoftext|>"),
                    ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"), "<|im_end|>", CHATML),
    "qwen2_5": Family(("<|im_start|>", "<|im_end|>", "<|endoftext|>"),
                      ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"), "<|im_end|>", CHATML),
    "llama3": Family(("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"),
                     (), "<|eot_id|>", LLAMA3),
    "mistral": Family(("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                       "[TOOL_RESULTS]", "[/TOOL_RESULTS]"), (), "</s>", MISTRAL),
    "deepseek_r1_distill": Family(("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"),
                                  ("<think>", "</think>"), "<｜end▁of▁sentence｜>", R1_TOOLS),
}


def build_tokenizer(family: str, out: Path, template: str | None = None) -> PreTrainedTokenizerFast:
    """The family's tokenizer, saved to `out` (a directory the envs can load) and returned."""
    spec = FAMILIES[family]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in spec.special])
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in spec.added])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=spec.eos, pad_token=spec.eos)
    tokenizer.chat_template = template or spec.template
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out))
    return PreTrainedTokenizerFast.from_pretrained(str(out))
