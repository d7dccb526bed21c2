"""Short chat templates in three models' tool-call formats, written for the tests: Hermes-style
blocks (as Qwen2.5's), Llama 3.1's JSON and Mistral's `[TOOL_CALLS]`. Each renders the tools,
an assistant turn's `tool_calls` (arguments as objects, `| tojson`) and `tool` turns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERMES = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Call a tool with <tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}<|im_start|>assistant
{{ m.content or '' }}{% for c in m.tool_calls or [] %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role != 'system' %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

LLAMA31 = """\
{{ bos_token }}{% if tools %}<|start_header_id|>system<|end_header_id|>

Environment: ipython
To call a function, respond with JSON {"name": function name, "parameters": dictionary of \
argument name and its value}.
{% for t in tools %}{{ t | tojson }}
{% endfor %}<|eot_id|>{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

{% for c in m.tool_calls %}{"name": "{{ c.function.name }}", "parameters": \
{{ c.function.arguments | tojson }}}{% endfor %}<|eot_id|>
{%- elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

MISTRAL = """\
{{ bos_token }}{% for m in messages %}
{%- if m.role == 'user' %}{% if loop.last and tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}\
[/AVAILABLE_TOOLS]{% endif %}[INST]{{ m.content }}[/INST]
{%- elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}\
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}, \
"id": "{{ c.id }}"}{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}
{%- elif m.role == 'tool' %}[TOOL_RESULTS]{"content": {{ m.content | tojson }}, \
"call_id": "{{ m.tool_call_id }}"}[/TOOL_RESULTS]
{%- elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}
{%- endif %}{% endfor %}"""


# One function tool for the tests of tool calling on the tiny model (its schema constrains a
# call's arguments).
FORECAST: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "forecast",
        "description": "The weather in a city for some days",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Oslo", "Rome", "Lima"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 9},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}


def build_tool_checkpoint(folder: Path, chat_template: str = HERMES, seed: int = 0) -> Path:
    """A tiny random llama (`tests.tiny_models`) whose vocabulary holds `<tool_call>` and
    `</tool_call>` as tokens of their own (plain added tokens, as in Qwen's) and whose chat
    template is `chat_template`; room for the long prompts tools make in its small vocabulary."""
    import torch
    from tokenizers import AddedToken
    from transformers import AutoModelForCausalLM

    from tests.tiny_models import SPECIAL, hf_config, train_tokenizer

    tok = train_tokenizer()
    tok.add_tokens([AddedToken(t, special=False) for t in ("<tool_call>", "</tool_call>")])
    eos = tok.token_to_id(SPECIAL)
    config = hf_config("llama", tok.get_vocab_size(), eos)
    config.max_position_embeddings = 2048
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    settings = {"eos_token": SPECIAL, "bos_token": SPECIAL, "chat_template": chat_template}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder
