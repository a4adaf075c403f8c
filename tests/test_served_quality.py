"""Quality through the server (notebook 09, labsupport.lab.http_serving_quality): perplexity and a
multiple-choice accuracy scored from echo + logprobs equal the same scores in process, for a
float and an int4 model; the scoring refuses a reply of the wrong shape and each typical
mistake (the first token scored, positions shifted, the wrong choice's tokens summed)."""

import math

import pytest
import torch
from fastapi import FastAPI

from labsupport.engine.quant import quantize_model
from labsupport.errors import LabError
from labsupport.lab import http_serving_quality as sq
from labsupport.serve import BackgroundServer, create_app
from labsupport.weights.fixtures import ByteTokenizer, random_model

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

NAME = "tiny-llama"
EVAL = list(b"The quick brown fox jumps over the lazy dog, twice over.")


@pytest.fixture(scope="module", params=["float32", "int4"])
def served(request):
    model = random_model(NAME)
    if request.param == "int4":
        quantize_model(model, "int4")
    app = create_app(model, ByteTokenizer(), NAME, max_slots=4, max_waiting=64, block_size=4)
    with BackgroundServer(app) as server:
        yield server, model


def test_served_scores_equal_the_in_process_ones(served):
    server, model = served
    row = sq.quality_row("ours", server.url, NAME, model, ByteTokenizer(), EVAL)
    assert row["largest_log_prob_difference"] < 1e-4
    assert math.isclose(row["served_perplexity"], row["in_process_perplexity"], rel_tol=1e-4)
    assert row["served_choice_accuracy"] == row["in_process_choice_accuracy"]
    assert row["questions"] == len(sq.CHOICE_QUESTIONS) and row["tokens"] == len(EVAL)


def test_in_process_log_probs_are_the_models_next_token_log_softmax():
    model = random_model(NAME, dtype=torch.float64)
    ids = EVAL[:12]
    lps = sq.in_process_log_probs(model, ids)
    with torch.no_grad():
        reference = model.logits(model(torch.tensor([ids])))[0].float().log_softmax(-1)     # (T, vocab)
    assert lps[0] is None and len(lps) == len(ids)
    assert all(abs(lps[t] - float(reference[t - 1, ids[t]])) < 1e-5 for t in range(1, len(ids)))
    shifted = [float(reference[t, ids[t]]) for t in range(1, len(ids))]         # the off-by-one mistake
    assert any(abs(a - b) > 1e-3 for a, b in zip(lps[1:], shifted))


def test_perplexity_skips_the_first_token_and_needs_two():
    assert math.isclose(sq.perplexity_from_log_probs([None, math.log(0.5), math.log(0.25)]), math.sqrt(8))
    with pytest.raises(LabError, match="at least two tokens"):
        sq.perplexity_from_log_probs([None])


def test_choice_accuracy_sums_each_choices_own_tokens():
    questions = (sq.ChoiceQuestion("q", (" a", " b"), 1), sq.ChoiceQuestion("r", (" c", " d"), 0))
    prompts = [([1, 2, 3], 1), ([1, 2, 4, 5], 2), ([6, 7], 1), ([6, 8], 1)]
    # the question's tokens score high under b; the choices' own: a -1, b -0.5-0.4 = -0.9; c -2, d -3
    log_probs = [[None, -9.0, -1.0], [None, 0.0, -0.5, -0.4], [None, -2.0], [None, -3.0]]
    assert sq.choice_accuracy(log_probs, prompts, questions) == 1.0
    assert sq.choice_accuracy([[None, -9.0, -1.0], [None, 0.0, -0.5, -0.6], [None, -3.0], [None, -2.0]],
                              prompts, questions) == 0.0


def test_choice_prompts_tokenize_question_and_choice_apart():
    tok = ByteTokenizer()
    prompts = sq.choice_prompts(tok)
    assert len(prompts) == sum(len(q.choices) for q in sq.CHOICE_QUESTIONS)
    ids, n = prompts[0]
    q = sq.CHOICE_QUESTIONS[0]
    assert ids == tok.encode(q.question, add_special_tokens=False) + tok.encode(q.choices[0], add_special_tokens=False)
    assert n == len(tok.encode(q.choices[0], add_special_tokens=False))


def test_a_reply_without_one_log_prob_per_token_is_one_sentence():
    app = FastAPI()

    @app.post("/v1/completions")
    def short(body: dict):
        return {"choices": [{"index": 0, "logprobs": {"token_logprobs": [None]}}]}
    with BackgroundServer(app) as server:
        with pytest.raises(LabError, match="one log-probability per prompt token"):
            sq.served_log_probs(server.url, NAME, [[1, 2, 3]])
    with pytest.raises(LabError, match="at least one prompt"):
        sq.served_log_probs("http://127.0.0.1:1", NAME, [])


def test_a_refused_request_is_one_sentence(served):
    server, _ = served
    with pytest.raises(LabError, match=r"answered 404 .*does not exist here"):
        sq.served_log_probs(server.url, "gpt-4", [[1, 2, 3]])
