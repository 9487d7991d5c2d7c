"""The development kit, outside the product package: builds, offline, the bundled tiny Llama
(the smoke test) and its demo datasets (`python -m devkit.tiny --out assets`), and the
conformance kit of tiny random-weight models of real families with their own tokenizer settings
and chat templates (`python -m devkit.families --out assets/models`). The tests and benchmarks
load what it builds through the same code path as any Hugging Face model directory; no product
module imports it."""
