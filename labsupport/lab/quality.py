"""Measuring a quantized model: the bytes a decode step reads, perplexity, KL divergence, top-1 agreement.

Introduced in notebook 04 (quantization).

Quality is measured as perplexity on a fixed text shipped with the package,
``labsupport/data/eval_text.txt``: the opening of chapter 1 of Lewis Carroll's
"Alice's Adventures in Wonderland" (1865, public domain), plain ASCII, about
4 KB (some 900 tokens with the SmolLM2 tokenizer). It is a well-known English
text, so a small instruct model predicts it well and a damaged model shows it.
The embedded SmolLM2 weights were distributed as Q4_1 (4 bits, blocks of 32):
int4 with groups of 32 reproduces every block's weights exactly (error 0), so
on this model all of its loss comes from the output layer, tied to the embedding,
which the file stored at a finer precision (``include_lm_head=False`` keeps it
float). Other group sizes cut across the original blocks and lose more (notebook
04 measures how much, on this machine's kernels). Models that arrive in 16-bit
show the usual pattern instead: smaller groups, less error.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import LabError

EVAL_TEXT_PATH = Path(__file__).parent.parent / "data" / "eval_text.txt"


def quantized_bytes(model: nn.Module) -> int:
    """Bytes a decode step reads: `weight_bytes()` plus the side tensors bitsandbytes keeps
    outside parameters and buffers (LLM.int8()'s row scales, 4-bit block absmax).
    Notebook 04 (quantization)."""
    from .quantization_error import bnb_side_bytes
    return model.weight_bytes() + sum(bnb_side_bytes(m) for m in model.modules())


def resident_bytes(model: nn.Module) -> int:
    """Bytes the model holds in memory, its footprint: every parameter and buffer once
    (`precision.tensor_bytes`: lookup tables included, such as a float embedding kept beside
    its quantized output layer), plus bitsandbytes' side tensors. Notebook 04 (quantization)."""
    from ..engine.precision import tensor_bytes
    from .quantization_error import bnb_side_bytes
    return tensor_bytes(model) + sum(bnb_side_bytes(m) for m in model.modules())


# --- quality -------------------------------------------------------------------------------

def eval_text() -> str:
    """The fixed evaluation text (see the module docstring). Notebook 04 (quantization)."""
    return EVAL_TEXT_PATH.read_text(encoding="ascii")


def eval_tokens(tokenizer, text: str | None = None, max_tokens: int = 512) -> list[int]:
    """The first `max_tokens` token ids of `text` (default: the evaluation text), at least 2.
    Notebook 04 (quantization)."""
    ids = tokenizer.encode(eval_text() if text is None else text, add_special_tokens=False)[:max_tokens]
    if len(ids) < 2:
        raise LabError("The evaluation text needs at least 2 tokens; give a longer text.")
    return ids


@torch.inference_mode()
def logits_of(model, ids) -> torch.Tensor:
    """Teacher-forced logits of one forward pass over `ids` (a list or 1-D tensor): (T, vocab), float32.
    Notebook 04 (quantization)."""
    tokens = torch.as_tensor(ids, dtype=torch.long, device=model.device).reshape(1, -1)   # (1, T)
    return model.logits(model(tokens))[0].float()                                        # (T, vocab)


def perplexity_from_logits(logits: torch.Tensor, ids) -> float:
    """exp(mean negative log-likelihood of each next token of `ids`) under `logits` (T, vocab),
    the logits of a forward pass over `ids`. Lower is better.

    Introduced in notebook 04 (quantization); notebook 08 scores its caches and windows with it."""
    targets = torch.as_tensor(ids, dtype=torch.long, device=logits.device).reshape(-1)[1:]    # (T - 1,)
    return math.exp(F.cross_entropy(logits[:-1].float(), targets).item())


def top1_agreement_from_logits(reference: torch.Tensor, other: torch.Tensor) -> float:
    """Fraction of positions where two logit tensors of the same shape (..., vocab) have the
    same argmax: the top-1 agreement. Introduced in notebook 04 (quantization); notebooks 03,
    07 and 08 use it too."""
    return (reference.argmax(-1) == other.to(reference.device).argmax(-1)).float().mean().item()


def _logit_pair(reference, other) -> None:
    """One sentence unless `reference` and `other` are real logit tensors of one non-empty shape
    (..., vocab) whose values are finite or -inf (probability 0), with a finite logit in every row."""
    for name, logits in (("reference", reference), ("other", other)):
        if not isinstance(logits, torch.Tensor) or logits.is_complex() or logits.dtype == torch.bool:
            what = f"a {logits.dtype} tensor" if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise LabError(f"kl_divergence_from_logits takes two real tensors of logits (..., vocab); {name} is "
                           f"{what}.")
    if reference.shape != other.shape or reference.dim() < 1 or reference.numel() == 0:
        raise LabError(f"kl_divergence_from_logits needs two logit tensors of one shape (..., vocab), with at "
                       f"least one position and one token; got {tuple(reference.shape)} and {tuple(other.shape)}.")
    for name, logits in (("reference", reference), ("other", other)):
        if torch.isnan(logits).any() or (logits == math.inf).any():
            raise LabError(f"The {name} logits hold nan or +inf; logits must be finite (or -inf for a token "
                           f"of probability 0).")
        if not torch.isfinite(logits).any(-1).all():
            raise LabError(f"A row of the {name} logits is all -inf, which is no distribution; every position "
                           f"needs at least one finite logit.")


def kl_divergence_from_logits(reference: torch.Tensor, other: torch.Tensor) -> float:
    """Mean KL divergence KL(P_reference || P_other), in nats per position, between the next-token
    distributions of two logit tensors of the same shape (..., vocab).

    Perplexity only asks how likely the true next token was; KL asks how far the whole
    distribution moved, so it sees a change that perplexity averages away (a quantized model can
    lose on one token and gain on another). It is 0 for identical distributions and never negative.
    A logit of -inf is a token of probability 0, which adds nothing where P_reference gives it 0
    (0 log 0 = 0); where P_other gives 0 to a token P_reference can emit, KL is infinite and
    refused in one sentence, as are nan or +inf logits and an empty vocabulary. Computed in
    float64 (float32 on an Apple GPU, which has no float64).
    Introduced in notebook 04 (quantization); notebook 08 measures its int8 cache with it."""
    _logit_pair(reference, other)
    wide = torch.float32 if reference.device.type == "mps" else torch.float64
    log_p = F.log_softmax(reference.to(wide), dim=-1)                             # (..., vocab)
    log_q = F.log_softmax(other.to(reference.device, wide), dim=-1)               # (..., vocab)
    p = log_p.exp()
    terms = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p))          # 0 log 0 = 0
    kl = terms.sum(-1).mean().clamp_min(0.0).item()
    if not math.isfinite(kl):
        raise LabError("other gives probability 0 (a -inf logit, or one far below the rest) to a token that "
                       "reference gives probability > 0, so KL(reference || other) is infinite.")
    return kl


def logit_summary(reference: torch.Tensor, other: torch.Tensor) -> dict:
    """How far `other`'s logits are from `reference`'s (same shape): max and mean absolute
    difference, and the top-1 agreement. Introduced in notebook 03 (mixed precision)."""
    diff = (reference.float() - other.float().to(reference.device)).abs()
    return {"max_abs_diff": diff.max().item(), "mean_abs_diff": diff.mean().item(),
            "top1_agreement": top1_agreement_from_logits(reference, other)}


def perplexity(model, tokenizer, text: str | None = None, max_tokens: int = 512) -> float:
    """exp(mean negative log-likelihood) of the next token over the first `max_tokens`
    tokens of `text` (default: the shipped evaluation text). Lower is better.

    Introduced in notebook 04 (quantization)."""
    ids = eval_tokens(tokenizer, text, max_tokens)
    return perplexity_from_logits(logits_of(model, ids), ids)


def top1_agreement(reference_model, model, tokens) -> float:
    """Fraction of positions where both models predict the same next token (argmax).

    Introduced in notebook 04 (quantization). tokens: ids as a list or 1-D tensor."""
    return top1_agreement_from_logits(logits_of(reference_model, tokens), logits_of(model, tokens))
