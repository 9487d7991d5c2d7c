"""What plain transformers and PEFT answer: the reference the service's model servers are held to."""

from __future__ import annotations


def reference_reply(base_dir, adapter, messages=None, prompt=None, max_new_tokens=16, state=None) -> str:
    """What plain transformers (+ PEFT) answer greedily from the model in `base_dir` (with the
    adapter in `adapter`, its trainable weights replaced by `state` when given): the text the
    service's completions must give."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    if adapter is not None and state is None:
        model = PeftModel.from_pretrained(model, str(adapter))
    elif adapter is not None:
        model = get_peft_model(model, LoraConfig.from_pretrained(str(adapter)))
        params = dict(model.named_parameters())
        assert set(state) <= set(params) and {n for n in params if ".lora_" in n} <= set(state)
        with torch.no_grad():
            for name, value in state.items():
                params[name].copy_(value)
    if messages is not None:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    else:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=tokenizer.eos_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
