"""What one decode step of the serving engine costs on this CPU (int4 SmolLM2-135M, the W4A8 kernel):
the step's median time at 1 to 4 rows and at contexts of 64 to 1,024 tokens, with each layer one C++
call over the paged pool (`fused.decode_block`, as the engine runs it) and with the layers' Python code
(the fused kernels off, each layer gathering its context). Prints one JSON line (issue 49).

    python scripts/serving_step_time.py

Run it alone on a quiet machine: it times a CPU.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from labsupport.engine.models import fused  # noqa: E402
from labsupport.engine.serving.engine import Engine  # noqa: E402
from labsupport.engine.serving.request import Request  # noqa: E402
from labsupport.lab.variants import ModelVariants  # noqa: E402
from labsupport.weights.loading import load_model  # noqa: E402

TEXT = "Write a short story about a robot who learns to paint. "
DECODE_STEPS = 30


def step_ms(model, prompt: list[int], rows: int) -> float:
    """Median ms of the decode steps of `rows` copies of `prompt`, every row decoding."""
    engine = Engine(model, max_slots=4, cache_tokens=4 * (len(prompt) + DECODE_STEPS + 8))
    for _ in range(rows):
        engine.add_request(Request(prompt, max_new_tokens=DECODE_STEPS))
    for _ in range(rows + 2):                 # the prefills, then every row decoding
        engine.step()
    seconds = []
    while engine.has_work:
        start = time.perf_counter()
        engine.step()
        seconds.append(time.perf_counter() - start)
    seconds.sort()
    return round(1e3 * seconds[len(seconds) // 2], 2)


def main() -> None:
    model, tok = load_model("smollm2-135m", device="cpu", dtype=torch.float32)
    int4 = ModelVariants(model).get("float32", "int4")
    ids = tok.encode(TEXT * 200)
    result = {"threads": torch.get_num_threads()}
    for label, on in (("one C++ call per layer", True), ("the layers' Python code", False)):
        with fused.switched(on):
            result[label] = {
                "rows (context 64)": {rows: step_ms(int4, ids[:64], rows) for rows in (1, 2, 3, 4)},
                "context (1 row)": {n: step_ms(int4, ids[:n], 1) for n in (64, 256, 1024)},
            }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
