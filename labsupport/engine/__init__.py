"""The engine, and nothing else: what an engineer reads in an afternoon beside nano-vllm and gpt-fast.

Read it in the order of the course: models/ (the compact Transformer, its config, masks and
weight-name mapping), hardware (device and dtype), kv_cache (the cache protocol and the
static cache; kv_quant the int8 one), sampling, generation (prefill, decode, generate, the
compiled decoder), padding, precision, linear_swap and quant/ (int8 / int4 layers and
kernels, our own W4A8 kernel among them), drafts and speculative, serving/ (requests, blocks,
prefix cache, paged cache, scheduler, model runner, engine step), parallel/ (tensor parallelism:
the split, the all-reduces, the ranks as processes). Sliding-window attention is the model's
own (`Transformer.with_attention_window`, masks.py).

It imports only itself, `labsupport.errors` and `labsupport.inputs` (tests/test_layering.py);
what measures it lives in `labsupport.lab`. Introduced in notebook 00 (where the time goes).
"""
