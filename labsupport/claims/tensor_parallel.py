"""The claims of notebook 10 (past one device), each set against this run's measurements.

Introduced in notebook 10 (past one device). The handbook chapter ends before parallelism; these
are the course's own claims (Megatron-LM's layout, and the lesson that communication is a cost
the roofline does not draw), each with a computed verdict, withheld on a busy machine."""

from __future__ import annotations

from ..lab.busy import busy_reason, judge
from .ratios import MARGIN, compare_speed


def tensor_parallel_claims(result: dict, busy: str | None = None) -> list[dict]:
    """Rows of claim, measured and verdict from `lab.tensor_parallel.measure_tensor_parallel`'s
    result (its first degree is the base, normally TP=1, the next the one judged).

    Introduced in notebook 10 (past one device). Thresholds: the tokens "hold" when every
    degree gave the base's greedy tokens; two all-reduces per layer "hold" at exactly
    2 x layers per forward pass; decode at batch 1 "does not pay" when TP's speed is below
    1/MARGIN (1.05) of the base, "pays" above MARGIN; the prefill amortizes the communication
    when its share of time inside the all-reduces is below the decode step's. `busy`: the
    machine's busy reason, which withholds the timed verdicts."""
    degrees = list(result["degrees"])
    base, world = result["degrees"][degrees[0]], degrees[1]
    tp = result["degrees"][world]
    layers = tp["prefill_all_reduces"] / 2
    ratio = tp["decode_tokens_per_s"] / base["decode_tokens_per_s"]
    pays = compare_speed(ratio, MARGIN)
    rows = [
        {"claim": f"(course) TP={world} gives TP={degrees[0]}'s greedy tokens",
         "measured": "the same tokens in every round" if tp["same_tokens"] else "different tokens",
         "verdict": "holds" if tp["same_tokens"] else "does not hold"},
        {"claim": "(Megatron-LM) a layer split column- then row-parallel needs two all-reduces",
         "measured": f"{tp['all_reduces_per_step']:.0f} all-reduces per decode step for {layers:.0f} layers",
         "verdict": "holds" if tp["all_reduces_per_step"] == 2 * layers else "does not hold"},
        {"claim": "(course) at batch 1, tensor parallelism over a slow link does not speed decoding up",
         "measured": f"TP={world}: {tp['decode_tokens_per_s']:.1f} tokens/s against {base['decode_tokens_per_s']:.1f} "
                     f"({ratio:.2f}x); {tp['all_reduce_share_of_decode']:.0%} of a step inside the all-reduces",
         "verdict": judge({"slower": "holds", "same": "holds: no measurable gain",
                           "faster": f"not here: TP={world} decoded {ratio:.2f}x faster"}[pays], busy)},
        {"claim": "(course) a long prefill amortizes the all-reduces better than a decode step",
         "measured": f"time inside the all-reduces: {tp['all_reduce_share_of_prefill']:.0%} of the prefill of "
                     f"{result['prefill_tokens']} tokens, {tp['all_reduce_share_of_decode']:.0%} of a decode step",
         "verdict": judge("holds" if tp["all_reduce_share_of_prefill"] < tp["all_reduce_share_of_decode"]
                          else "does not hold here", busy)},
    ]
    return rows


def tensor_parallel_section_claims(section: dict) -> list[dict]:
    """The bench section's claims: `tensor_parallel_claims` of its result (none where fewer than
    two degrees ran) and `disaggregation_claims` at its highest arrival rate. Introduced in
    notebook 10 (past one device)."""
    rows = []
    if section.get("result"):
        rows += tensor_parallel_claims(section["result"], busy_reason({}, load=section.get("load")))
    if section.get("disaggregation"):
        rows += disaggregation_claims(list(section["disaggregation"].values())[-1])   # the last (highest) rate
    return rows


def tensor_parallel_losses(result: dict, links: list[dict], disaggregation: dict | None = None) -> list[str]:
    """Where tensor parallelism (and disaggregated serving) did not pay on this machine, one
    sentence each, from this run's measurements (`measure_tensor_parallel`, `link_arithmetic`,
    `disaggregated.compare_with_colocated`). Introduced in notebook 10 (past one device): its
    "where it loses here" ledger. Thresholds: a degree "loses" below 1/MARGIN of the base's
    speed; disaggregation loses below 1/MARGIN of the colocated engine's goodput."""
    degrees = list(result["degrees"])
    base, lines = result["degrees"][degrees[0]], []
    for world in degrees[1:]:
        d = result["degrees"][world]
        decode = d["decode_tokens_per_s"] / base["decode_tokens_per_s"]
        prefill = base["prefill_s"] / d["prefill_s"]
        if compare_speed(decode, MARGIN) == "slower":
            lines.append(f"Decoding at batch 1, TP={world} ran at {decode:.2f}x TP={degrees[0]}'s speed. Each step made "
                         f"{d['all_reduces_per_step']:.0f} all-reduces of one row, and {d['all_reduce_share_of_decode']:.0%} "
                         "of the step went inside them. That time is their latency, and waiting for the slower rank.")
        if compare_speed(prefill, MARGIN) == "slower":
            lines.append(f"The prefill of {result['prefill_tokens']} tokens ran at {prefill:.2f}x. On one machine's "
                         "cores, two processes of one thread do not multiply faster than one process of two. So "
                         "splitting the weights gained nothing that the communication did not take back.")
        uneven = {s["kv_heads"] for s in d["shares"]}
        if len(uneven) > 1:
            lines.append(f"The {sum(s['kv_heads'] for s in d['shares'])} key/value heads split "
                         f"{' + '.join(str(s['kv_heads']) for s in d['shares'])}: the rank with more attention "
                         "sets the pace, and the others wait for it at every all-reduce.")
    for row in links:
        if row["share_of_measured_step"] < 0.05:
            lines.append(f"Over {row['link']} the same {row['all_reduces_per_step']:.0f} all-reduces would take "
                         f"{row['seconds_per_step'] * 1e3:.2f} ms, {row['share_of_measured_step']:.1%} of this "
                         "machine's decode step. So the link is not what makes tensor parallelism lose here. A GPU's "
                         "step is 10-100x shorter, so there the same link costs that much more of it.")
            break
    if disaggregation is not None:
        split, together = disaggregation["disaggregated"], disaggregation["colocated"]
        if together["goodput"] and compare_speed(split["goodput"] / together["goodput"], MARGIN) == "slower":
            lines.append(f"Disaggregated serving reached {split['goodput']:.2f} requests/s of goodput against the "
                         f"colocated engine's {together['goodput']:.2f}. Its decode worker had one of the two cores, "
                         f"so a token took {split['tpot_p50'] * 1e3:.0f} ms at the median against "
                         f"{together['tpot_p50'] * 1e3:.0f} ms. The stall it removes was already bounded by chunked "
                         "prefill.")
    return lines or ["Nothing measured here lost to its baseline."]


def disaggregation_claims(comparison: dict, busy: str | None = None) -> list[dict]:
    """Rows of claim, measured and verdict from `lab.tensor_parallel_disaggregated.compare_with_colocated`.
    Introduced in notebook 10 (past one device). Thresholds: the tokens "hold" when every request
    got the same tokens both ways; DistServe's claim "holds" when disaggregated goodput is at
    least MARGIN (1.05) times the colocated engine's, "no measurable difference" within it, and
    "not here" below it. `busy` withholds the timed verdict."""
    split, together = comparison["disaggregated"], comparison["colocated"]
    ratio = split["goodput"] / together["goodput"] if together["goodput"] else float("inf")
    verdict = {"faster": "holds", "same": "no measurable difference here",
               "slower": f"not here: {ratio:.2f}x the colocated engine's goodput"}[compare_speed(ratio, MARGIN)]
    handover = comparison["handover"]
    return [
        {"claim": "(course) a request served disaggregated gets the tokens it gets from one engine",
         "measured": f"{comparison['requests']} requests, every one the same" if comparison["same_tokens"]
         else "some requests differ", "verdict": "holds" if comparison["same_tokens"] else "does not hold"},
        {"claim": "(DistServe) separating prefill from decode raises goodput under latency objectives",
         "measured": f"goodput {split['goodput']:.2f} against {together['goodput']:.2f} requests/s "
                     f"(TTFT <= {split['ttft_slo']:g} s, TPOT <= {split['tpot_slo']:g} s); a handover of "
                     f"{handover['bytes_per_request'] / 2**20:.1f} MiB took {handover['seconds_per_request'] * 1e3:.1f} ms",
         "verdict": judge(verdict, busy)},
    ]
