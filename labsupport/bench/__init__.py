"""Benchmarks: every speed figure of the course, measured side by side, as JSON.

Introduced in notebook 00 (where the time goes); each notebook adds its section.
Run ``python -m labsupport bench`` (see ``--help``). A notebook's section lives in the module
named by its stem (tests/test_stems.py), with its prompts. Shared: core, options, suite, baseline,
engines, engines_int4, compiled_decode, compile_options, peers. (baseline, engines and compile
measure the whole engine against its peers, whatever the notebook; peers/ holds the adapters.)

    core          --  BenchContext (the model loaded once, one ModelVariants per run), `reported`, all_figures, write_json
    options       --  SectionOptions: what every section's options dataclass shares (validation, presets, flags)
    suite         --  SECTIONS in the course's order (the only list), BenchOptions (one of each), and `run`
    peers/        --  the peer adapters: huggingface (generate, a padded batch, the stack's), continuous_batching
                      (Hugging Face's and vLLM's, in process), llamacpp (optional extra `peers`), http_servers
                      (llama-server, llama-cpp-python's and vLLM's servers, for 09)
    baseline      00  labsupport generate() vs Hugging Face's; the bandwidth a decode step reaches
    engines       00  every peer side by side: HF (dynamic, static + compile, prompt lookup, assisted), llama.cpp
    engines_int4  00  the engines section's int4 rows past one row (a long prefill, 8 rows at once) against llama.cpp
    roofline      00  decode-step sweep over batch sizes on this machine's roofline
    kv_cache      01  the uncached loop vs the static KV cache; GQA and 128K-context arithmetic
    batching      02  throughput vs batch size, padding waste, Hugging Face on a padded batch
    precision     03  memory, decode and prefill speed, agreement per dtype
    quantization  04  memory, decode speed and quality of int8 / int4 / bitsandbytes
    speculative   05  prompt lookup and the int4 self-draft vs plain and Hugging Face decoding
    serving       06  static vs continuous batching vs Hugging Face's continuous batching
    stack         07  every technique stacked on one workload
    compiled_decode 07  eager vs compiled decode per precision and batch (section "compile"; only when named;
                        its options: compile_options.CompileOptions)
    long_context  08  int8 vs float KV cache (bytes, decode speed), naive vs fused prefill memory, crossovers
    http_serving  09  our HTTP server against llama-server and vLLM under load (only when named);
                      http_serving_agentic: whole agent conversations against the prefix cache
    tensor_parallel 10  TP=1 against TP=2 on these cores, and disaggregated against colocated serving

A section is a function ``(context, options) -> dict``, its options one small validated
dataclass kept beside it (`BaselineOptions`, `KVCacheOptions`, ...). Its dict holds the raw
timings, what its claims function takes (`suite.Section.claims`, in claims/: the chapter's
claims with computed verdicts, which the suite stores under ``"claims"``) and a list of
`reported` entries (name, value, unit, target, met, note, busy) under ``"figures"``. Every
ratio is measured in one run, with the candidates interleaved (`measure.time_side_by_side`),
because shared machines are noisy. Absolute times mean something only on a dedicated GPU.
"""

from .core import BenchContext, all_figures, reported, write_json
from .options import SectionOptions
from .suite import SECTIONS, BenchOptions, run

__all__ = ["BenchContext", "BenchOptions", "SECTIONS", "SectionOptions", "all_figures", "reported", "run",
           "write_json"]
