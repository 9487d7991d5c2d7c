"""The conformance kit: real model families (tiny random weights, each family's own special
tokens, BOS/EOS behaviour and verbatim chat template, built at setup by
`python -m devkit.families`), held to what a fine-tuning service must get right.

For every chat family, the trained tokens must be exactly the assistant turns as read off the
rendered text with the family's own markers (computed here, independently of the code under
test); templates that refuse a record give a TemplateError naming the fix; packing is exact or
the architecture is not packed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from eft.training.chat import TemplateError, label_mask, tokenize_chat
from eft.training.data import IGNORE_INDEX, Example, tokenize_record
from devkit.families import model_name
from devkit.family_specs import FAMILIES
from eft.training.attention import VARLEN_NAMES, register as register_varlen
from eft.training.packing import collate_packed, packed_inputs, packing_is_exact
from tests.helpers.paths import REPO

MODELS = REPO / "assets" / "models"

#: How each family's template frames an assistant turn: the text just before the turn (what
#: the generation prompt ends with) and the end-of-turn text the model must learn to emit.
TURNS = {
    "llama-3.1": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    "llama-3.2": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    "qwen2.5": ("<|im_start|>assistant\n", "<|im_end|>"),
    "qwen3": ("<|im_start|>assistant\n", "<|im_end|>"),
    "smollm2": ("<|im_start|>assistant\n", "<|im_end|>"),
    "phi-4": ("<|im_start|>assistant<|im_sep|>", "<|im_end|>"),
    "phi-3": ("<|assistant|>\n", "<|end|>"),
    "gemma-2": ("<start_of_turn>model\n", "<end_of_turn>"),
    "gemma-3": ("<start_of_turn>model\n", "<end_of_turn>"),
    "gemma-3-mm": ("<start_of_turn>model\n", "<end_of_turn>"),
    "mistral": ("[/INST]", "</s>"),
    "mistral-v0.1": ("[/INST]", "</s>"),
}
CHAT_FAMILIES = [f for f in sorted(FAMILIES) if FAMILIES[f].get("chat_template")]
NO_SYSTEM_ROLE = {"gemma-2", "mistral-v0.1"}
STRICT_ALTERNATION = {"mistral", "mistral-v0.1", "gemma-2", "gemma-3", "gemma-3-mm"}

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris is the capital."},
    {"role": "user", "content": "And the weather?"},
    {"role": "assistant", "content": "The weather is sunny today."},
]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    path = MODELS / model_name(request.param)
    assert (path / "config.json").is_file(), f"{path} missing: run `make setup`"
    return request.param, path


def _tokenizer(path: Path):
    return AutoTokenizer.from_pretrained(path)


def expected_spans(family: str, text: str) -> list[tuple[int, int]]:
    """Assistant turns read off the rendered text with the family's markers."""
    head, end = TURNS[family]
    spans = []
    for match in re.finditer(re.escape(head), text):
        stop = text.index(end, match.end()) + len(end)
        spans.append((match.end(), stop))
    return spans


def _conversation(family: str) -> list[dict]:
    return CONVERSATION[1:] if family in NO_SYSTEM_ROLE else CONVERSATION


@pytest.mark.parametrize("name", CHAT_FAMILIES)
def test_assistant_mask_is_exactly_the_assistant_turns(name):
    tokenizer = _tokenizer(MODELS / model_name(name))
    messages = _conversation(name)
    ids, trained = tokenize_chat(tokenizer, messages)
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    assert ids == encoded["input_ids"]
    spans = expected_spans(name, text)
    assert len(spans) == 2, text
    assert trained == label_mask(encoded["offset_mapping"], spans)
    # What is trained reads as the two answers, each with the family's end-of-turn text.
    head, end = TURNS[name]
    trained_text = tokenizer.decode([t for t, keep in zip(ids, trained) if keep])
    for answer in ("Paris is the capital.", "The weather is sunny today."):
        assert answer in trained_text
    assert trained_text.count(end) == 2
    for prompt_word in ("France", "weather?", "helpful"):
        assert prompt_word not in trained_text
    # Never a doubled BOS: the template adds it where the family has one, the tokenizer not again.
    if tokenizer.bos_token_id is not None:
        assert ids[:2] != [tokenizer.bos_token_id] * 2


@pytest.mark.parametrize("name", CHAT_FAMILIES)
def test_weight_zero_and_last_turn_only(name):
    tokenizer = _tokenizer(MODELS / model_name(name))
    messages = [dict(m) for m in _conversation(name)]
    messages[-3]["weight"] = 0  # the first answer is context, not a target
    for kwargs in ({}, {"train_on": "last_assistant"}):
        ids = [dict(m) for m in _conversation(name)] if kwargs else messages
        ids, trained = tokenize_chat(tokenizer, ids, **kwargs)
        trained_text = tokenizer.decode([t for t, keep in zip(ids, trained) if keep])
        assert "sunny" in trained_text and "Paris" not in trained_text
    ids, trained = tokenize_chat(tokenizer, messages, train_on="all")
    assert all(trained)


@pytest.mark.parametrize("name", CHAT_FAMILIES)
def test_a_template_that_refuses_names_the_rule_and_the_fix(name):
    tokenizer = _tokenizer(MODELS / model_name(name))
    if name in NO_SYSTEM_ROLE:
        with pytest.raises(TemplateError, match="system_message to 'fold'"):
            tokenize_chat(tokenizer, CONVERSATION)
        ids, trained = tokenize_chat(tokenizer, CONVERSATION, system_message="fold")
        text = tokenizer.decode(ids)
        assert "helpful assistant" in text and any(trained)
    doubled = [{"role": "user", "content": "Hello."}, {"role": "user", "content": "Hello again."},
               {"role": "assistant", "content": "Hi."}]
    if name in STRICT_ALTERNATION:
        with pytest.raises(TemplateError, match="alternate"):
            tokenize_chat(tokenizer, doubled)
    else:
        ids, trained = tokenize_chat(tokenizer, doubled)
        trained_text = tokenizer.decode([t for t, k in zip(ids, trained) if k])
        assert "Hi." in trained_text and "Hello" not in trained_text


def test_a_model_without_chat_template_refuses_chat_records():
    tokenizer = _tokenizer(MODELS / model_name("gpt2"))
    with pytest.raises(TemplateError) as caught:
        tokenize_chat(tokenizer, CONVERSATION)
    assert caught.value.rule == "no_chat_template" and "prompt/completion" in str(caught.value)


def test_prompt_completion_is_one_sequence(family):
    name, path = family
    tokenizer = _tokenizer(path)
    prompt, completion = "What is the capital of France?", " Paris is the capital."
    example = tokenize_record(tokenizer, {"prompt": prompt, "completion": completion}, 512)
    whole = tokenizer(prompt + completion)["input_ids"]
    eos = tokenizer.eos_token_id
    assert example.input_ids == whole + ([eos] if whole[-1] != eos else [])
    trained = [t for t, label in zip(example.input_ids, example.labels) if label != IGNORE_INDEX]
    assert tokenizer.decode(trained, skip_special_tokens=True).strip() == completion.strip()
    assert trained[-1] == eos


def _logits(model, batch):
    with torch.no_grad():  # as the training step calls it: no cache, so position ids separate examples
        return model(**batch, use_cache=False).logits


def _positions_only(examples):
    return {k: v for k, v in collate_packed(examples, 0).items() if k in ("input_ids", "position_ids")}


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_packed_kernels_attend_per_example(family, kernel):
    """What a packed job of this family runs (`training/attention.py`): the per-example kernel
    given the examples' boundaries. Each example's logits equal its logits alone under the
    family's own eager attention (sliding windows and soft-capping included), and do not move
    when another example changes."""
    name, path = family
    config = AutoConfig.from_pretrained(path)
    if not packing_is_exact(config.get_text_config().model_type):
        return  # trained padded: the test above shows why
    register_varlen()
    stock = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 attn_implementation=VARLEN_NAMES[kernel]).eval()
    gen = torch.Generator().manual_seed(1)
    vocab = min(config.get_text_config().vocab_size, 500)
    examples = [Example(ids, ids) for ids in
                (torch.randint(5, vocab, (n,), generator=gen).tolist() for n in (7, 12, 5, 9))]

    def packed_logits(batch):
        inputs = packed_inputs(collate_packed(batch, 0), torch.device("cpu"), kernel)
        return _logits(model, inputs)[0]

    packed = packed_logits(examples)
    starts = [0, 7, 19, 24]
    for start, example in zip(starts, examples):
        alone = _logits(stock, {"input_ids": torch.tensor([example.input_ids])})[0]
        torch.testing.assert_close(packed[start : start + len(example.input_ids)], alone, rtol=1e-4, atol=1e-4,
                                   msg=lambda m: f"{name} with {VARLEN_NAMES[kernel]}: {m}")
    changed = packed_logits([examples[0], Example([5] * 12, [5] * 12), *examples[2:]])
    assert torch.equal(changed[19:], packed[19:]) and torch.equal(changed[:7], packed[:7])


def test_packing_is_exact_or_refused(family):
    """Three examples packed in one row, given only the position ids (the stock kernels'
    block-diagonal mask): each one's logits equal its logits alone, and do not move when another
    example in the row changes."""
    name, path = family
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    config = model.config
    gen = torch.Generator().manual_seed(0)
    vocab = min(config.get_text_config().vocab_size, 500)
    examples = [Example(ids, ids) for ids in
                (torch.randint(5, vocab, (n,), generator=gen).tolist() for n in (7, 5, 9))]
    alone = [_logits(model, {"input_ids": torch.tensor([e.input_ids])})[0] for e in examples]
    packed = _logits(model, _positions_only(examples))[0]
    changed = [examples[0], Example([5] * 5, [5] * 5), examples[2]]
    packed_changed = _logits(model, _positions_only(changed))[0]
    starts = [0, 7, 12]
    exact = all(
        torch.allclose(packed[s : s + len(e.input_ids)], a, atol=1e-4)
        for s, e, a in zip(starts, examples, alone)
    ) and torch.allclose(packed[12:21], packed_changed[12:21], atol=1e-4)
    assert exact == packing_is_exact(config.get_text_config().model_type), (
        f"{name} ({config.model_type}): packing is {'exact' if exact else 'NOT exact'}; "
        "the service's list of exactly packed architectures must say so")


TOOLS = [{"type": "function", "function": {
    "name": "weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
TOOL_CONVERSATION = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "The weather is sunny today."},
]


@pytest.mark.parametrize("name", ["llama-3.1", "qwen2.5", "qwen3"])
def test_tool_calls_are_rendered_and_trained(name):
    """OpenAI-style `tools` and `tool_calls` go through the family's template; the assistant's
    call is trained, the tool's answer and the tool definitions are not."""
    tokenizer = _tokenizer(MODELS / model_name(name))
    ids, trained = tokenize_chat(tokenizer, TOOL_CONVERSATION, tools=TOOLS)
    text = tokenizer.apply_chat_template(TOOL_CONVERSATION, tools=TOOLS, tokenize=False)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    assert "The weather in a city." in text  # the tool definitions are in the prompt
    assert trained == label_mask(encoded["offset_mapping"], expected_spans(name, text))
    trained_text = tokenizer.decode([t for t, keep in zip(ids, trained) if keep])
    assert '"weather"' in trained_text and "Paris" in trained_text and "sunny today" in trained_text
    assert "The weather in a city." not in trained_text


def test_earlier_reasoning_dropped_by_the_template_is_not_trained():
    """Qwen 3 renders an earlier turn's `<think>` away once a later user turn follows: the
    trained tokens are what the template keeps."""
    tokenizer = _tokenizer(MODELS / model_name("qwen3"))
    messages = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "<think>\nI recall it.\n</think>\n\nParis is the capital."},
        {"role": "user", "content": "And the weather?"},
        {"role": "assistant", "content": "<think>\nLook outside.\n</think>\n\nThe weather is sunny."},
    ]
    ids, trained = tokenize_chat(tokenizer, messages)
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert "I recall it." not in text and "Look outside." in text
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    assert trained == label_mask(encoded["offset_mapping"], expected_spans("qwen3", text))
    trained_text = tokenizer.decode([t for t, keep in zip(ids, trained) if keep])
    assert "Paris is the capital." in trained_text and "Look outside." in trained_text


@pytest.mark.parametrize("name", ["llama-3.1", "qwen2.5", "phi-3", "gemma-2", "gpt2", "gemma-3-mm"])
def test_lora_model_state_is_what_the_planner_counts(name):
    """LoRA under DDP in bf16: frozen base weights in bf16, adapters (and their gradients and
    AdamW states) in fp32. Weights + gradients + optimizer states, in bytes, are the planner's
    parameter, gradient and optimizer terms for the same model, term by term, exactly (2θ + 4φ, 4φ,
    8φ)."""
    import dataclasses

    from eft.planner.architectures import architecture_from_config
    from eft.planner.memory import GB, estimate_memory
    from eft.planner.spec import Configuration, PlanSpec
    from eft.service.requests.model_support import inspect_model
    from eft.training.config import TrainConfig
    from eft.training.model import load_trainable_model

    path = MODELS / model_name(name)
    support = inspect_model(str(path))
    lora = support.lora_spec("all-linear")  # a multimodal checkpoint: its text model only
    cfg = TrainConfig(job_id="j", model_path=str(path), training_file="t", validation_file=None,
                      method="lora", lora=lora, total_steps=1, num_train_examples=1,
                      precision="bf16", strategy="ddp", attention="eager")
    model = load_trainable_model(cfg)
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert {p.dtype for p in trainable} == {torch.float32} and {p.dtype for p in frozen} == {torch.bfloat16}
    phi = sum(p.numel() for p in trainable)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    gradients, adamw = 4 * phi, 8 * phi  # fp32 gradients; AdamW's fp32 momentum and variance

    arch = dataclasses.replace(architecture_from_config(path), linears=support.linears,
                               num_parameters=support.parameters)
    estimate = estimate_memory(PlanSpec(arch, method="lora", lora_r=8), Configuration("ddp"))
    assert arch.lora_parameters(8, "all-linear") == phi
    planned = (estimate.parameters * GB, estimate.gradients * GB, estimate.optimizer * GB)
    assert planned == pytest.approx((weights, gradients, adamw), rel=1e-9)


#: Families whose decoder layer the planner's activation model describes operation by operation
#: (pre-norm RMSNorm, rotary attention, SwiGLU; Phi's fused projections). Gemma's four norms per
#: layer, Qwen 3's q/k norms, GPT-2's dropouts and python GELU, and OPT/Bloom/Pythia's LayerNorm
#: layouts depart from it: see BENCHMARKS.md.
ACTIVATION_FAMILIES = ["llama-3.1", "llama-3.2", "mistral", "qwen2.5", "smollm2", "phi-3", "phi-4"]


def _saved_bytes(model: torch.nn.Module, batch: int, length: int) -> int:
    """Bytes of the distinct storages autograd keeps in one forward of `model`'s decoder (under
    PEFT: its base model's) on batch x length tokens; the model's own parameters and buffers aside."""
    owned = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in owned:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(5, 200, (batch, length), generator=torch.Generator().manual_seed(0))
    decoder = (model.get_base_model() if hasattr(model, "get_base_model") else model).get_decoder()
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        decoder(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    return sum(saved.values())


@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("name", ACTIVATION_FAMILIES)
def test_planned_activations_are_what_autograd_saves(name, method):
    """The planner's forward activations (every layer's saved tensors and the final norm's) against
    the bytes autograd actually saves in one forward of the family's decoder, counted once per
    storage through `saved_tensors_hooks`; LoRA all-linear with dropout 0.05, fp32 on CPU."""
    import dataclasses

    from peft import LoraConfig, get_peft_model

    from eft.planner.architectures import architecture_from_config
    from eft.planner.memory import forward_bytes
    from eft.planner.spec import Configuration, PlanSpec
    from eft.service.requests.model_support import inspect_model
    from eft.training.model import peft_target_modules

    path = MODELS / model_name(name)
    support = inspect_model(str(path))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    if method == "lora":
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, task_type="CAUSAL_LM",
                                                 target_modules=peft_target_modules(support.lora_spec("all-linear"))))
    b, s = 2, 32
    saved = _saved_bytes(model.train(), b, s)
    arch = dataclasses.replace(architecture_from_config(path), linears=support.linears,
                               num_parameters=support.parameters)
    spec = PlanSpec(arch, method=method, seq_len=s, micro_batch=b, precision="fp32", device="cpu",
                    **({"lora_r": 8, "lora_dropout": 0.05} if method == "lora" else {}))
    planned = forward_bytes(spec, Configuration("ddp", attention="sdpa"))
    # Exact per layer; the spread is the first layer, whose input needs no gradient under LoRA
    # (its norm and its q/k/v dropouts keep less), a larger share of 2 layers than of 32.
    assert planned == pytest.approx(saved, rel=0.12), (planned, saved)


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
@pytest.mark.parametrize("name", ACTIVATION_FAMILIES)
def test_planned_bf16_activations_are_what_autograd_saves(name, method):
    """The same in bf16, as a GPU job runs: the module in bf16 for full fine-tuning, a bf16 base
    with fp32 adapters under bf16 autocast for LoRA (the DDP strategy's layout, activations kept
    in bf16 through the adapters), bitsandbytes' nf4 layers after PEFT's k-bit preparation for
    QLoRA (they run on the CPU too). The norms' fp32 copies and QLoRA's fp32 MLP are counted."""
    import contextlib
    import dataclasses

    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig

    from eft.planner.architectures import architecture_from_config
    from eft.planner.memory import forward_bytes
    from eft.planner.spec import Configuration, PlanSpec
    from eft.service.requests.model_support import inspect_model
    from eft.training.lora import keep_activation_dtype
    from eft.training.model import peft_target_modules

    path = MODELS / model_name(name)
    support = inspect_model(str(path))
    torch.manual_seed(0)
    kwargs = {"dtype": torch.bfloat16, "attn_implementation": "sdpa"}
    if method == "qlora":
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                           bnb_4bit_compute_dtype=torch.bfloat16,
                                                           bnb_4bit_use_double_quant=True)
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if method == "qlora":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if method != "full":
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                                                 target_modules=peft_target_modules(support.lora_spec("all-linear"))))
        keep_activation_dtype(model)
    b, s = 2, 32
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if method != "full" else contextlib.nullcontext()
    with autocast:
        saved = _saved_bytes(model.train(), b, s)
    arch = dataclasses.replace(architecture_from_config(path), linears=support.linears,
                               num_parameters=support.parameters)
    spec = PlanSpec(arch, method=method, seq_len=s, micro_batch=b, precision="bf16", device="cuda",
                    **({"lora_r": 8, "lora_dropout": 0.0} if method != "full" else {}))
    planned = forward_bytes(spec, Configuration("ddp", attention="sdpa"))
    assert planned == pytest.approx(saved, rel=0.12), (planned, saved)


def _lora_family_model(path: Path, alpha: int):
    """The family's model in fp32 with LoRA r 4 on every linear layer, B non-zero."""
    from peft import LoraConfig, get_peft_model

    from eft.service.requests.model_support import inspect_model
    from eft.training.model import peft_target_modules

    support = inspect_model(str(path))
    torch.manual_seed(0)
    return get_peft_model(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager"),
        LoraConfig(r=4, lora_alpha=alpha, task_type="CAUSAL_LM", init_lora_weights=False,
                   target_modules=peft_target_modules(support.lora_spec("all-linear"))))


def _prompted_examples(config, seed: int, shapes: tuple[tuple[int, int], ...]) -> list[Example]:
    """Random examples of (length, prompt) tokens: a prompt that is not trained, then the answer."""
    gen = torch.Generator().manual_seed(seed)
    vocab = min(config.get_text_config().vocab_size, 500)
    examples = []
    for n, prompt in shapes:
        ids = torch.randint(5, vocab, (n,), generator=gen).tolist()
        examples.append(Example(ids, [IGNORE_INDEX] * prompt + ids[prompt:]))
    return examples


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_loss_projects_only_the_targeted_positions(family, packed):
    """The training loss asks the model for the logits of the positions that predict a target
    only (`logits_to_keep`): the output projection sees exactly those rows, and the loss and
    every LoRA gradient equal those of all positions' logits, on each family's own model (tied
    or untied output embeddings, Gemma's soft-capping, GPT-2's Conv1D, OPT, Bloom)."""
    from eft.training.steps import keeps_logits, token_cross_entropy_sum, token_loss_sum

    name, path = family
    config = AutoConfig.from_pretrained(path)
    if packed and not packing_is_exact(config.get_text_config().model_type):
        return  # trained padded
    model = _lora_family_model(path, alpha=8)
    assert keeps_logits(model), f"{name}: its causal LM takes no logits_to_keep mask"
    examples = _prompted_examples(config, 2, ((9, 4), (14, 6), (6, 5)))
    if packed:
        batch = collate_packed(examples, 0)
        inputs = {k: batch[k] for k in ("input_ids", "position_ids")}
    else:
        from eft.training.data import collate

        batch = collate(examples, config.get_text_config().pad_token_id or 0)
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    labels = batch["labels"]
    targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)

    rows = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
    kept = token_loss_sum(model, {**inputs, "labels": labels})
    kept_grads = torch.autograd.grad(kept, [p for p in model.parameters() if p.requires_grad])
    all_logits = model(**inputs, use_cache=False).logits
    full = token_cross_entropy_sum(all_logits, targets)
    full_grads = torch.autograd.grad(full, [p for p in model.parameters() if p.requires_grad])
    hook.remove()

    assert rows[0] == int((targets != IGNORE_INDEX).sum()) < rows[1] == targets.numel(), (name, rows)
    torch.testing.assert_close(kept, full, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")
    for a, b in zip(kept_grads, full_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_fused_lora_update_is_pefts_own(family):
    """`training/lora.py` sums each LoRA update into its layer's output with one `addmm` (the
    scaling on the rank-sized activation): on every family's own model the loss, every LoRA
    gradient and the merged weights equal PEFT's forward's, every LoRA linear layer runs the
    fused forward, and the saved adapter is the same tensors under the same names."""
    from eft.training.data import collate
    from eft.training.lora import FusedLora, fuse_lora_updates
    from eft.training.steps import token_loss_sum

    name, path = family
    config = AutoConfig.from_pretrained(path)
    # alpha / r = 1.5: a scaling that rounds (a power of two would hide a misplaced scaling)
    model = _lora_family_model(path, alpha=6)
    batch = collate(_prompted_examples(config, 3, ((11, 4), (7, 3))), config.get_text_config().pad_token_id or 0)
    trainable = [p for p in model.parameters() if p.requires_grad]

    def loss_and_grads():
        loss = token_loss_sum(model, batch)
        return loss, torch.autograd.grad(loss, trainable)

    stock_loss, stock_grads = loss_and_grads()
    saved = {k: v.clone() for k, v in model.state_dict().items() if "lora_" in k}
    layers = [m for m in model.modules() if hasattr(m, "lora_variant") and m.lora_A]
    assert fuse_lora_updates(model, "ddp") == len(layers) > 0, name
    calls = []
    original = FusedLora.forward
    FusedLora.forward = staticmethod(lambda *a, **k: calls.append(1) or original(*a, **k))
    try:
        fused_loss, fused_grads = loss_and_grads()
    finally:
        FusedLora.forward = staticmethod(original)
    assert len(calls) == len(layers), (name, len(calls), len(layers))
    torch.testing.assert_close(fused_loss, stock_loss, rtol=1e-6, atol=1e-5, msg=lambda m: f"{name}: {m}")
    for a, b in zip(fused_grads, stock_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    assert {k: v for k, v in model.state_dict().items() if "lora_" in k}.keys() == saved.keys()
    # Merging goes through the variant too: the same weights as PEFT's vanilla merge.
    layer = layers[0]
    delta = layer.get_delta_weight("default")
    before = layer.get_base_layer().weight.detach().clone()
    layer.merge(safe_merge=True)
    torch.testing.assert_close(layer.get_base_layer().weight, before + delta)
    layer.unmerge()
    torch.testing.assert_close(layer.get_base_layer().weight, before)


LONG_CONVERSATION = [{"role": "user" if i % 2 == 0 else "assistant",
                      "content": f"Turn {i}: " + ("a question?" if i % 2 == 0 else "an answer.")} for i in range(12)]


@pytest.mark.parametrize("name", CHAT_FAMILIES)
def test_one_pass_spans_are_the_prefix_renderings_spans(name):
    """Masking renders the conversation once and finds each turn in order; for every family
    and conversation shape it trains exactly the tokens the definition (rendering every prefix)
    trains."""
    from eft.training.chat import _shape, _spans_by_prefixes, _spans_in_order, render

    tokenizer = _tokenizer(MODELS / model_name(name))
    conversations = [(_conversation(name), None), (LONG_CONVERSATION, None),
                     ([{"role": "user", "content": "Same."}, {"role": "assistant", "content": "Same."}], None)]
    if name in ("llama-3.1", "qwen2.5", "qwen3"):
        conversations.append((TOOL_CONVERSATION, TOOLS))
    for messages, tools in conversations:
        shape = _shape(tokenizer, tools)
        assert shape is not None, name
        full = render(tokenizer, messages, tools)
        offsets = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        one_pass = [(s.start, s.end) for s in _spans_in_order(full, messages, shape)]
        by_prefixes = [(s.start, s.end) for s in _spans_by_prefixes(tokenizer, messages, tools, full)]
        assert len(one_pass) == len(by_prefixes) == sum(m["role"] == "assistant" for m in messages)
        assert label_mask(offsets, one_pass) == label_mask(offsets, by_prefixes), (messages, one_pass, by_prefixes)


@pytest.mark.parametrize("name", ["qwen2.5", "llama-3.1", "mistral"])
def test_masking_costs_linear_in_the_turns(name, monkeypatch):
    """Before, each assistant turn rendered the conversation up to it twice: 10x the turns cost
    ~100x the rendering (a 700-turn record took 22 s). Counted as characters the template
    renders, 10x the turns now cost about 10x."""
    tokenizer = _tokenizer(MODELS / model_name(name))
    rendered = []
    real = tokenizer.apply_chat_template

    def counting(*args, **kwargs):
        out = real(*args, **kwargs)
        rendered.append(len(out) if isinstance(out, str) else 0)
        return out

    monkeypatch.setattr(tokenizer, "apply_chat_template", counting)
    cost = {}
    for turns in (20, 200):
        messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Message number {i}."}
                    for i in range(turns)]
        tokenize_chat(tokenizer, messages)  # the template's shape is read once per tokenizer
        rendered.clear()
        ids, trained = tokenize_chat(tokenizer, messages)
        cost[turns] = sum(rendered)
        assert sum(trained) > 0
    assert cost[200] <= 12 * cost[20], cost
