"""The peers the bench measures ours against, each behind one adapter: Hugging Face's generate
(`huggingface`), its and vLLM's continuous batching in process (`continuous_batching`), llama.cpp
in process (`llamacpp`, the optional extra `peers`) and the peer servers over HTTP (`http_servers`:
llama-server, llama-cpp-python's server, vLLM's).

Introduced in notebook 00 (where the time goes). Importing this package imports none of them.
"""
