"""labsupport: the engine behind the course on fast LLM text generation."""
