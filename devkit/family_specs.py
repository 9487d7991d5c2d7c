"""Real model families for the conformance kit: each family's verbatim chat template and tokenizer settings, with sources.

`FAMILIES` maps a family key to the facts a tiny random-weight copy of that family must keep:
its architecture and `model_type`, tied or untied embeddings, a few architecture-defining
config values of the real checkpoint (never sizes: the tiny copy picks its own), the real
tokenizer's style, named special tokens and BOS/EOS behaviour, and the chat template copied
byte for byte from a public copy of the checkpoint's `tokenizer_config.json` /
`chat_template.jinja` (each `source` names the file and commit it was read from; `notes` says
what was checked against what, and which values come from knowledge rather than a file).

Templates are raw triple-quoted strings: what is between the quotes is the template, exactly
(a `\\n` inside is a Jinja escape, a line break is a line break). Pure data, no imports.
"""
from __future__ import annotations

FAMILIES: dict[str, dict] = {
    "llama-3.1": {
        "hub_id": "meta-llama/Llama-3.1-8B-Instruct",
        "source": "https://github.com/ggml-org/llama.cpp/blob/1eeb523c3e0c7ffbd59469f5463dcbdecba3535e/models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja",
        "architecture": "LlamaForCausalLM",
        "model_type": "llama",
        "tie_word_embeddings": False,
        "config": {
            "hidden_act": "silu",
            "rms_norm_eps": 1e-05,
            "attention_bias": False,
            "mlp_bias": False,
            "rope_theta": 500000.0,
            # Llama-3 frequency-dependent RoPE scaling (8k pre-training context stretched to 128k).
            "rope_scaling": {
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
        },
        "tokenizer": {
            "style": "byte_level",  # tiktoken-derived byte-level BPE, 128256 ids
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>",
            "pad_token": None,
            "unk_token": None,
            "add_bos_token": True,  # the tokenizer.json TemplateProcessing post-processor prepends BOS
            "add_eos_token": False,
            "special_tokens": [
                "<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>",
                "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
            ],
        },
        "chat_template": r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
""",
        "notes": (
            "Template: the file in llama.cpp models/templates (fetched from the Hub by scripts/get_chat_template.py, "
            "added in llama.cpp PR #9639); byte-identical to the copies in huggingface.js "
            "packages/jinja/test/e2e.test.js ('meta-llama/Llama-3.1-8B-Instruct') and "
            "packages/ollama-utils/src/chat-template-automap.ts (library/llama3.1:8b). It starts with bos_token "
            "(the tokenizer also adds BOS on plain encode, so re-encoding rendered text must use "
            "add_special_tokens=False), always emits a system header with 'Cutting Knowledge Date: December 2023' "
            "and 'Today Date: ' + date_string (default '26 Jul 2024'), trims message contents, supports tools "
            "(tools_in_user_message, builtin_tools, <|python_tag|>, <|eom_id|>). No {% generation %} markers. "
            "Tokenizer and config values from knowledge of the checkpoint's tokenizer_config.json / config.json "
            "(eos_token '<|eot_id|>'; config eos_token_id [128001, 128008, 128009]; no pad token)."
        ),
    },
    "llama-3.2": {
        "hub_id": "meta-llama/Llama-3.2-1B-Instruct",
        "source": "https://github.com/ggml-org/llama.cpp/blob/1eeb523c3e0c7ffbd59469f5463dcbdecba3535e/models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja",
        "architecture": "LlamaForCausalLM",
        "model_type": "llama",
        "tie_word_embeddings": True,
        "config": {
            "hidden_act": "silu",
            "rms_norm_eps": 1e-05,
            "attention_bias": False,
            "mlp_bias": False,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
        },
        "tokenizer": {
            "style": "byte_level",
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>",
            "pad_token": None,
            "unk_token": None,
            "add_bos_token": True,
            "add_eos_token": False,
            "special_tokens": [
                "<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>",
                "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
            ],
        },
        "chat_template": r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
""",
        "notes": (
            "Template read from llama.cpp's copy of meta-llama/Llama-3.2-3B-Instruct; the 1B-Instruct checkpoint "
            "ships the same template (to our knowledge; no separate 1B copy was found). Byte-identical to "
            "huggingface.js chat-template-automap.ts library/llama3.2:3b. Unlike 3.1 it computes the date: "
            "if date_string is undefined it calls strftime_now('%d %b %Y') when defined, else '26 Jul 2024', and "
            "always injects the 'Cutting Knowledge Date / Today Date' system header (so rendered text depends on "
            "the day unless date_string is passed). Same Llama-3 tokenizer as 3.1; 1B has tied embeddings and "
            "head_dim 64 (values from knowledge of config.json)."
        ),
    },
    "qwen2.5": {
        "hub_id": "Qwen/Qwen2.5-0.5B-Instruct",
        "source": "https://github.com/ggml-org/llama.cpp/blob/1eeb523c3e0c7ffbd59469f5463dcbdecba3535e/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja",
        "architecture": "Qwen2ForCausalLM",
        "model_type": "qwen2",
        "tie_word_embeddings": True,  # 0.5B (and 1.5B/3B) tie; 7B and larger do not
        "config": {
            "hidden_act": "silu",
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            # Real values: sliding_window 32768 with use_sliding_window false (max_window_layers 21 is a
            # layer count, left to the tiny copy). q/k/v projections carry a bias in Qwen2 (built in).
            "use_sliding_window": False,
            "sliding_window": 32768,
        },
        "tokenizer": {
            "style": "byte_level",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "add_bos_token": False,
            "add_eos_token": False,
            "special_tokens": [
                "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
                "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                "<|repo_name|>", "<|file_sep|>",
            ],
        },
        "chat_template": r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
""",
        "notes": (
            "Template read from llama.cpp's copy of Qwen/Qwen2.5-7B-Instruct (all Qwen2.5 instruct sizes ship this "
            "template to our knowledge); byte-identical to huggingface.js e2e.test.js 'Qwen/Qwen2.5-7B-Instruct' and to "
            "the chat_template in https://github.com/microsoft/onnxruntime-extensions/blob/319f8d2c02c4e2f013129bea52e70e75ba79bbcf/test/data/qwen2.5/tokenizer_config.json. (The GGUF of ollama "
            "library/qwen2.5:0.5b in chat-template-automap.ts differs only by doubled braces in the tool-call "
            "example text.) Injects the default system prompt 'You are Qwen, created by Alibaba Cloud. You are a "
            "helpful assistant.' when the first message is not a system message; supports tools (<tool_call>, "
            "role 'tool' rendered as <tool_response> inside a user turn). Tokenizer values from that "
            "onnxruntime-extensions tokenizer_config.json (bos_token null, eos '<|im_end|>', pad '<|endoftext|>', "
            "add_bos_token false, the 22 added tokens); config values from knowledge of the 0.5B config.json."
        ),
    },
    "qwen3": {
        "hub_id": "Qwen/Qwen3-0.6B",
        "source": "https://github.com/ggml-org/llama.cpp/blob/1eeb523c3e0c7ffbd59469f5463dcbdecba3535e/models/templates/Qwen-Qwen3-0.6B.jinja",
        "architecture": "Qwen3ForCausalLM",
        "model_type": "qwen3",
        "tie_word_embeddings": True,
        "config": {
            "hidden_act": "silu",
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000,
            "rope_scaling": None,
            "attention_bias": False,  # Qwen3 drops the q/k/v bias and adds q_norm/k_norm (built in)
            "use_sliding_window": False,
            "sliding_window": None,
        },
        "tokenizer": {
            "style": "byte_level",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "add_bos_token": False,
            "add_eos_token": False,
            "special_tokens": [
                "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
                "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
            ],
        },
        "chat_template": r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}""",
        "notes": (
            "Template byte-identical in three places: llama.cpp models/templates/Qwen-Qwen3-0.6B.jinja, huggingface.js "
            "e2e.test.js 'Qwen/Qwen3-0.6B', and chat-template-automap.ts library/qwen3:0.6b. No default system "
            "prompt. Strips reasoning: an assistant turn before the last user query is rendered with its "
            "<think>...</think> removed (content after '</think>'), only turns after it keep "
            "'<think>\\n' + reasoning + '\\n</think>\\n\\n'; with add_generation_prompt and enable_thinking=false it "
            "appends an empty '<think>\\n\\n</think>\\n\\n'. So a multi-turn rendering is not a prefix of a longer one. "
            "A later variant (checks 'message.content is string', e.g. https://github.com/microsoft/onnxruntime-extensions/blob/319f8d2c02c4e2f013129bea52e70e75ba79bbcf/test/data/qwen3/tokenizer_config.json) "
            "exists but is not attributed to the 0.6B checkpoint. Tokenizer values from that onnxruntime-extensions "
            "qwen3 tokenizer_config.json (26 added tokens incl. <think>, </think>); config values from knowledge."
        ),
    },
    "mistral": {
        "hub_id": "mistralai/Mistral-7B-Instruct-v0.3",
        "source": "https://github.com/ggml-org/llama.cpp/blob/1eeb523c3e0c7ffbd59469f5463dcbdecba3535e/tests/test-chat-template.cpp#L230",
        "architecture": "MistralForCausalLM",
        "model_type": "mistral",
        "tie_word_embeddings": False,
        "config": {
            "hidden_act": "silu",
            "rms_norm_eps": 1e-05,
            "rope_theta": 1000000.0,
            "sliding_window": None,  # v0.2+ dropped sliding-window attention
        },
        "tokenizer": {
            "style": "sentencepiece",  # Mistral v3 SentencePiece BPE with byte fallback, 32768 ids
            "bos_token": "<s>",
            "eos_token": "</s>",
            "pad_token": None,
            "unk_token": "<unk>",
            "add_bos_token": True,
            "add_eos_token": False,
            "special_tokens": [
                "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
            ],
        },
        "chat_template": r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
""",
        "notes": (
            "CLOSEST REAL TEMPLATE, not a verified copy of v0.3's own file: no public copy of "
            "Mistral-7B-Instruct-v0.3's tokenizer_config.json was found. This is Mistral's 'v3' tool-calling "
            "template as published for mistralai/Mistral-Large-Instruct-2407 (same V3 SentencePiece tokenizer), "
            "copied verbatim in llama.cpp tests/test-chat-template.cpp (entry \"Mistral-Large-Instruct-2407 "
            "(mistralai 'v3' template ...)\", added in llama.cpp PR #10572); to our knowledge the Hub's v0.3 "
            "tokenizer_config.json carries this same template (the same text also appears in third-party code "
            "as the template of lmstudio-community/Mistral-7B-Instruct-v0.3-GGUF). An earlier v0.3 template (no "
            "alternation check, tool markers with leading spaces) is kept in huggingface.js e2e.test.js "
            "'mistralai/Mistral-7B-Instruct-v0.3 (JSON Schema)'. Behaviour: requires user/assistant alternation "
            "(tool calls and tool results excepted) and raises otherwise; an optional leading system message is "
            "prepended to the LAST user turn ('[INST] ' + system + '\\n\\n' + content + '[/INST]'); assistant "
            "turns render as ' ' + content|trim + eos_token; BOS from bos_token in the template. Tokenizer values "
            "from knowledge (control tokens [control_8]..[control_768] omitted)."
        ),
    },
    "mistral-v0.1": {
        "hub_id": "mistralai/Mistral-7B-Instruct-v0.1",
        "source": "https://github.com/abetlen/llama-cpp-python/blob/3691546f1c9e0c1bf93323dff02230bd959cf562/llama_cpp/llama_chat_format.py#L48",
        "architecture": "MistralForCausalLM",
        "model_type": "mistral",
        "tie_word_embeddings": False,
        "config": {
            "hidden_act": "silu",
            "rms_norm_eps": 1e-05,
            "rope_theta": 10000.0,
            "sliding_window": 4096,
        },
        "tokenizer": {
            "style": "sentencepiece",  # Llama-2-style SentencePiece BPE with byte fallback, 32000 ids
            "bos_token": "<s>",
            "eos_token": "</s>",
            "pad_token": None,
            "unk_token": "<unk>",
            "add_bos_token": True,
            "add_eos_token": False,
            "special_tokens": ["<unk>", "<s>", "</s>"],
        },
        "chat_template": r"""{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}""",
        "notes": (
            "The original v0.1 template, copied in llama-cpp-python as MISTRAL_INSTRUCT_CHAT_TEMPLATE with the "
            "comment 'Source: https://huggingface.co/mistralai/Mistral-7B-Instruct-v0.1/blob/main/tokenizer_config.json' "
            "(added there Jan 2024); byte-identical to huggingface.js e2e.test.js 'TheBloke/Mistral-7B-Instruct-v0.1-GPTQ' "
            "and to the GGUF template of ollama library/mistral:7b-instruct-fp16 (chat-template-automap.ts). It has no "
            "system role: any message that is not user/assistant in alternation raises ('Conversation roles must "
            "alternate user/assistant/user/assistant/...', or 'Only user and assistant roles are supported!'), so a "
            "conversation starting with a system message is refused. Assistant turns render as content + eos_token + ' '. "
            "Since mid-2024 (Hub PR #120 'Align tokenizer with mistral-common') the Hub repo carries instead the "
            "mistral-common 'v1' template (optional leading system message folded into the first user turn as "
            "' [INST] ' + system + '\\n\\n' + content + ' [/INST]', still alternation-checked); that text is in llama.cpp "
            "tests/test-chat-template.cpp line 222 and equals huggingface.js automap library/mixtral:8x7b. "
            "Tokenizer/config values from knowledge."
        ),
    },
    "gemma-2": {
        "hub_id": "google/gemma-2-2b-it",
        "source": "https://github.com/ggml-org/llama.cpp/blob/1eeb523c3e0c7ffbd59469f5463dcbdecba3535e/models/templates/google-gemma-2-2b-it.jinja",
        "architecture": "Gemma2ForCausalLM",
        "model_type": "gemma2",
        "tie_word_embeddings": True,
        "config": {
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh",
            "rms_norm_eps": 1e-06,
            "rope_theta": 10000.0,
            "attention_bias": False,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            # Scores are scaled by query_pre_attn_scalar**-0.5, not head_dim**-0.5; 256 equals the real
            # head_dim (the tiny copy's head_dim differs, the scalar is kept as the checkpoint has it).
            "query_pre_attn_scalar": 256,
            "sliding_window": 4096,  # alternating local (sliding) / global attention layers
        },
        "tokenizer": {
            "style": "sentencepiece",  # Gemma SentencePiece, byte fallback, 256000 ids
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "add_bos_token": True,
            "add_eos_token": False,
            "special_tokens": ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"],
        },
        "chat_template": r"""{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '
' + message['content'] | trim + '<end_of_turn>
' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model
'}}{% endif %}""",
        "notes": (
            "Template byte-identical to huggingface.js chat-template-automap.ts library/gemma2:2b. Raises "
            "'System role not supported' on a leading system message and 'Conversation roles must alternate "
            "user/assistant/user/assistant/...' otherwise; role 'assistant' is rendered as 'model'; contents are "
            "trimmed; starts with bos_token (the tokenizer also adds BOS on plain encode). Turn ends with "
            "'<end_of_turn>\\n' (generation_config eos ids are [1, 107] = <eos>, <end_of_turn>). Tokenizer values "
            "as in the Gemma tokenizer_config.json (add_bos_token true, additional_special_tokens <start_of_turn>, "
            "<end_of_turn>; see https://github.com/microsoft/onnxruntime-extensions/blob/319f8d2c02c4e2f013129bea52e70e75ba79bbcf/test/data/gemma/tokenizer_config.json for the same GemmaTokenizer settings); "
            "config values from knowledge of gemma-2-2b-it config.json."
        ),
    },
    "gemma-3": {
        "hub_id": "google/gemma-3-1b-it",
        "source": "https://github.com/microsoft/onnxruntime-extensions/blob/319f8d2c02c4e2f013129bea52e70e75ba79bbcf/test/data/models/gemma-3/tokenizer_config.json",
        "architecture": "Gemma3ForCausalLM",
        "model_type": "gemma3_text",
        "tie_word_embeddings": True,
        # gemma-3-4b-it and larger are multimodal: architectures ["Gemma3ForConditionalGeneration"],
        # model_type "gemma3", with a nested "text_config" (model_type "gemma3_text", the values below plus
        # its sizes, rope_scaling {"rope_type": "linear", "factor": 8.0}, sliding_window 1024), a
        # "vision_config" (model_type "siglip_vision_model"), mm_tokens_per_image 256 and image token ids
        # (boi_token_index 255999, eoi_token_index 256000, image_token_index 262144). 1b-it is text-only
        # and flat: Gemma3ForCausalLM / gemma3_text at the top level.
        "config": {
            "hidden_activation": "gelu_pytorch_tanh",
            "rms_norm_eps": 1e-06,
            "attention_bias": False,
            "attn_logit_softcapping": None,
            "final_logit_softcapping": None,
            "query_pre_attn_scalar": 256,  # equals the real head_dim (256)
            "rope_theta": 1000000.0,  # global-attention layers
            "rope_local_base_freq": 10000.0,  # sliding-window layers
            "rope_scaling": None,
            "sliding_window": 512,
            "sliding_window_pattern": 6,  # 5 local layers then 1 global
        },
        "tokenizer": {
            "style": "sentencepiece",  # Gemma 3 SentencePiece, byte fallback, 262144 ids
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "add_bos_token": True,
            "add_eos_token": False,
            "special_tokens": [
                "<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>",
                "<start_of_image>", "<end_of_image>", "<image_soft_token>",
            ],
        },
        "chat_template": r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '

' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '

' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '
' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model
'}}
{%- endif -%}
""",
        "notes": (
            "Template from the onnxruntime-extensions copy of google/gemma-3-4b-it's tokenizer_config.json (its test "
            "compares against HF output for 'google/gemma-3-4b-it'; test/data/gemma-3-chat/chat_template.json there "
            "holds the identical text). The gemma-3 instruct checkpoints share one template; no separate 1b-it copy "
            "was found. An earlier release variant without the 'content is string' branch is the GGUF template of "
            "ollama library/gemma3:1b (huggingface.js chat-template-automap.ts). Folds a leading system message into "
            "the first user turn (system content + '\\n\\n' prefix), raises 'Conversation roles must alternate "
            "user/assistant/user/assistant/...', renders 'assistant' as 'model', accepts string or list content "
            "(image items become <start_of_image>), trims text, starts with bos_token. Tokenizer values from that "
            "tokenizer_config.json (add_bos_token true, eos '<eos>'; generation_config eos ids [1, 106] = <eos>, "
            "<end_of_turn>); 1b config values from knowledge of its config.json."
        ),
    },
    "phi-3": {
        "hub_id": "microsoft/Phi-3-mini-4k-instruct",
        "source": "https://github.com/microsoft/onnxruntime-extensions/blob/319f8d2c02c4e2f013129bea52e70e75ba79bbcf/test/data/phi-3-mini/tokenizer_config.json",
        "architecture": "Phi3ForCausalLM",
        "model_type": "phi3",
        "tie_word_embeddings": False,
        "config": {
            "hidden_act": "silu",
            "rms_norm_eps": 1e-05,
            "rope_theta": 10000.0,
            "rope_scaling": None,
            "attention_bias": False,
            "sliding_window": 2047,
        },
        "tokenizer": {
            "style": "sentencepiece",  # Llama-2 SentencePiece (32000) + Phi-3 added tokens, 32064 rows
            "bos_token": "<s>",
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "unk_token": "<unk>",
            "add_bos_token": False,
            "add_eos_token": False,
            "special_tokens": [
                "<unk>", "<s>", "</s>", "<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>",
                "<|placeholder3|>", "<|placeholder4|>", "<|system|>", "<|end|>", "<|placeholder5|>",
                "<|placeholder6|>", "<|user|>",
            ],
        },
        "chat_template": r"""{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'user' %}{{'<|user|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>
' + message['content'] + '<|end|>
'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>
' }}{% else %}{{ eos_token }}{% endif %}""",
        "notes": (
            "Template and tokenizer values from the onnxruntime-extensions copy of Phi-3-mini-4k-instruct's "
            "tokenizer_config.json (model_max_length 4096; its test compares against HF output for "
            "'microsoft/Phi-3-mini-4k-instruct'); the template is byte-identical to huggingface.js "
            "chat-template-automap.ts library/phi3:3.8b. Each turn is '<|role|>\\n' + content + '<|end|>\\n'; system "
            "turns are kept; with add_generation_prompt it ends '<|assistant|>\\n', otherwise it appends eos_token "
            "('<|endoftext|>'). No BOS anywhere: add_bos_token is false and the template does not emit bos_token "
            "(the 2024 update removed both). The assistant turn ends at <|end|> (generation_config eos ids "
            "[32000, 32001, 32007]). Config values from knowledge of config.json (padding_side 'left' in the "
            "tokenizer_config)."
        ),
    },
    "phi-4": {
        "hub_id": "microsoft/phi-4",
        "source": "https://github.com/microsoft/onnxruntime-extensions/blob/319f8d2c02c4e2f013129bea52e70e75ba79bbcf/test/data/phi-4-base/tokenizer_config.json",
        "architecture": "Phi3ForCausalLM",
        "model_type": "phi3",
        "tie_word_embeddings": False,
        "config": {
            "hidden_act": "silu",
            "rms_norm_eps": 1e-05,
            "rope_theta": 250000,
            "rope_scaling": None,
            "attention_bias": False,
            "sliding_window": None,
        },
        "tokenizer": {
            "style": "byte_level",  # tiktoken cl100k-derived byte-level BPE (GPT2Tokenizer class), 100352 rows
            "bos_token": "<|endoftext|>",
            "eos_token": "<|im_end|>",
            "pad_token": "<|dummy_85|>",
            "unk_token": None,
            "add_bos_token": False,
            "add_eos_token": False,
            "special_tokens": [
                "<|dummy_0|>", "<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                "<|im_start|>", "<|im_end|>", "<|im_sep|>", "<|endofprompt|>", "<|dummy_85|>",
            ],
        },
        "chat_template": r"""{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'assistant') %}{{'<|im_start|>assistant<|im_sep|>' + message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}""",
        "notes": (
            "Template and tokenizer values from the onnxruntime-extensions copy of microsoft/phi-4's "
            "tokenizer_config.json (bos '<|endoftext|>', eos '<|im_end|>', pad '<|dummy_85|>', no unk_token key, "
            "model_max_length 16384, GPT2Tokenizer: no BOS added on encode). Turns are '<|im_start|>' + role + "
            "'<|im_sep|>' + content + '<|im_end|>' with no newlines; generation prompt '<|im_start|>assistant<|im_sep|>'. "
            "The original release template (user turn followed directly by the assistant header, no "
            "add_generation_prompt branch) is the one in llama.cpp tests/test-chat-template.cpp 'phi-4' and the "
            "GGUF of ollama library/phi4:14b. special_tokens lists the used ones (the file adds <|dummy_1|>.."
            "<|dummy_86|> too). Config values from knowledge of config.json."
        ),
    },
    "smollm2": {
        "hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "source": "https://github.com/huggingface/huggingface.js/blob/fe42e68017ffc76d09922ea8f9b38a6964345710/packages/ollama-utils/src/chat-template-automap.ts#L1342",
        "architecture": "LlamaForCausalLM",
        "model_type": "llama",
        "tie_word_embeddings": True,
        "config": {
            "hidden_act": "silu",
            "rms_norm_eps": 1e-05,
            "rope_theta": 100000,
            "attention_bias": False,
            "mlp_bias": False,
        },
        "tokenizer": {
            "style": "byte_level",  # GPT-2-style byte-level BPE (GPT2Tokenizer class), 49152 ids
            "bos_token": "<|im_start|>",
            "eos_token": "<|im_end|>",
            "pad_token": "<|im_end|>",
            "unk_token": "<|endoftext|>",
            "add_bos_token": False,
            "add_eos_token": False,
            "special_tokens": [
                "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>",
                "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>",
                "<jupyter_start>", "<jupyter_text>", "<jupyter_code>", "<jupyter_output>", "<jupyter_script>",
                "<empty_output>",
            ],
        },
        "chat_template": r"""{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %}""",
        "notes": (
            "Template: the GGUF chat template of ollama library/smollm2:135m (= HuggingFaceTB/SmolLM2-135M-Instruct), "
            "as recorded in huggingface.js packages/ollama-utils/src/chat-template-automap.ts (a generated file); "
            "the same string is asserted equal to the Hub file's chat_template, together with bos '<|im_start|>', "
            "eos '<|im_end|>' and model_max_length 8192, by a public Rust test that loads "
            "HuggingFaceTB/SmolLM2-135M-Instruct/tokenizer_config.json (repository not identified by the search "
            "tool). ChatML; injects the default system prompt 'You are a helpful AI assistant named SmolLM, trained "
            "by Hugging Face' when the first message is not a system message; no BOS token emitted (bos_token is "
            "'<|im_start|>' and is not prepended on encode). pad/unk and the added-token list from knowledge of the "
            "tokenizer_config.json (the 17 added tokens match derived checkpoints' copies); config values from "
            "knowledge (the Instruct config has bos_token_id 1, eos_token_id 2)."
        ),
    },
    "gpt2": {
        "hub_id": "openai-community/gpt2",
        "source": None,
        "architecture": "GPT2LMHeadModel",
        "model_type": "gpt2",
        "tie_word_embeddings": True,
        "config": {
            "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-05,
            "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False,
        },
        "tokenizer": {
            "style": "byte_level",
            "bos_token": "<|endoftext|>",
            "eos_token": "<|endoftext|>",
            "pad_token": None,
            "unk_token": "<|endoftext|>",
            "add_bos_token": False,
            "add_eos_token": False,
            "special_tokens": ["<|endoftext|>"],
        },
        "chat_template": None,
        "notes": (
            "Base model, no chat template (chat records must be refused). Learned absolute position embeddings, "
            "Conv1D projections (c_attn/c_proj/c_fc), tokenizer_config.json only sets model_max_length 1024; one "
            "special token '<|endoftext|>' serves as bos/eos/unk, no pad. Values from knowledge."
        ),
    },
    "pythia": {
        "hub_id": "EleutherAI/pythia-70m",
        "source": None,
        "architecture": "GPTNeoXForCausalLM",
        "model_type": "gpt_neox",
        "tie_word_embeddings": False,
        "config": {
            "hidden_act": "gelu",
            "layer_norm_eps": 1e-05,
            "rotary_pct": 0.25,  # partial rotary: RoPE on a quarter of each head's dimensions
            "rotary_emb_base": 10000,
            "use_parallel_residual": True,
        },
        "tokenizer": {
            "style": "byte_level",
            "bos_token": "<|endoftext|>",
            "eos_token": "<|endoftext|>",
            "pad_token": None,
            "unk_token": "<|endoftext|>",
            "add_bos_token": False,
            "add_eos_token": False,
            "special_tokens": ["<|endoftext|>", "<|padding|>"],
        },
        "chat_template": None,
        "notes": (
            "Base model, no chat template. GPT-NeoX: fused query_key_value projection, parallel attention+MLP "
            "residual, partial rotary embeddings, untied embed_in/embed_out. GPT-NeoX-20B tokenizer: "
            "'<|endoftext|>' (id 0) is bos/eos/unk; '<|padding|>' (id 1) is an added token but not set as "
            "pad_token. Values from knowledge of config.json / tokenizer_config.json."
        ),
    },
    "opt": {
        "hub_id": "facebook/opt-125m",
        "source": None,
        "architecture": "OPTForCausalLM",
        "model_type": "opt",
        "tie_word_embeddings": True,
        "config": {
            "activation_function": "relu",
            "do_layer_norm_before": True,
        },
        "tokenizer": {
            "style": "byte_level",  # GPT-2 BPE (GPT2Tokenizer class)
            "bos_token": "</s>",
            "eos_token": "</s>",
            "pad_token": "<pad>",
            "unk_token": "</s>",
            "add_bos_token": True,  # OPT prepends '</s>' (id 2) as BOS on every encode
            "add_eos_token": False,
            "special_tokens": ["<s>", "<pad>", "</s>", "<unk>"],
        },
        "chat_template": None,
        "notes": (
            "Base model, no chat template. Learned positional embeddings with an offset of 2; the 125m config also "
            "has dropout 0.1 (training behaviour, not copied here). The tokenizer prepends '</s>' as BOS "
            "(tokenizer_config add_bos_token true; bos/eos/unk all '</s>', pad '<pad>' id 1). Values from knowledge."
        ),
    },
    "bloom": {
        "hub_id": "bigscience/bloom-560m",
        "source": None,
        "architecture": "BloomForCausalLM",
        "model_type": "bloom",
        "tie_word_embeddings": True,
        "config": {
            "layer_norm_epsilon": 1e-05,
            "apply_residual_connection_post_layernorm": False,
            "slow_but_exact": False,
        },
        "tokenizer": {
            "style": "byte_level",  # BLOOM byte-level BPE, 250880 rows
            "bos_token": "<s>",
            "eos_token": "</s>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "add_bos_token": False,
            "add_eos_token": False,
            "special_tokens": ["<unk>", "<s>", "</s>", "<pad>"],
        },
        "chat_template": None,
        "notes": (
            "Base model, no chat template. ALiBi attention biases instead of position embeddings (padding-sensitive), "
            "fused query_key_value, LayerNorm after the word embeddings. The tokenizer adds no BOS/EOS on encode "
            "(ids: <unk> 0, <s> 1, </s> 2, <pad> 3; padding_side 'left' in tokenizer_config). Values from knowledge."
        ),
    },
}

#: Gemma 3 4B and larger: the same text model, tokenizer and chat template inside a multimodal
#: checkpoint (`Gemma3ForConditionalGeneration`, model_type "gemma3"), whose text values sit in
#: `text_config` beside a SigLIP `vision_config`. Training reads the text model only: LoRA
#: targets stay in the language model, never the vision tower or the projector.
FAMILIES["gemma-3-mm"] = {
    **FAMILIES["gemma-3"],
    "hub_id": "google/gemma-3-4b-it",
    "architecture": "Gemma3ForConditionalGeneration",
    "model_type": "gemma3",
    "text_model_type": "gemma3_text",
    # The vision tower at a toy size; the real one is SigLIP so400m (hidden 1152, 27 layers,
    # 896-pixel images in 14-pixel patches, pooled to 256 tokens per image).
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                      "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28,
                      "patch_size": 14, "vision_use_head": False},
    "multimodal_config": {"mm_tokens_per_image": 4},
    "image_tokens": {"boi_token_index": "<start_of_image>", "eoi_token_index": "<end_of_image>",
                     "image_token_index": "<image_soft_token>"},
    "notes": (
        "Gemma 3 4B-it layout: the text model of gemma-3 (same tokenizer and chat template) nested in "
        "text_config, a SigLIP vision_config, image token ids in the top-level config."
    ),
}
