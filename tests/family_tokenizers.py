"""Chat templates of a family's shape that no fetched family provides (the real tokenizers and
official templates come from opd.fixture.families).

R1_STOCK has the shape of the DeepSeek-R1 distills' official template, which ignores `tools`: the
official file is on the model hub only, and the start-up check's test needs a template that drops
the tools. It is used over the real R1 tokenizer.
"""

from __future__ import annotations

R1_STOCK = (
    "<｜begin▁of▁sentence｜>{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' %}<｜User｜>{{ message.content }}"
    "{% elif message.role == 'assistant' %}<｜Assistant｜>{{ message.content }}<｜end▁of▁sentence｜>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"
)
