"""Predicted Outputs (drafters/prediction.py): the client's expected text as a draft source.

The alignment is checked on token lists (the drafter's own logic); the engine on the F32
synthetic target, where every verify width computes one-token decoding's logits, so output
with a prediction must equal plain output token for token, whatever the drafter behind it;
the server through the real openai client.
"""

from __future__ import annotations

import pytest

from specgguf.api import SpecGGUF
from specgguf.drafters.ngram import NgramDrafter
from specgguf.drafters.prediction import PredictionDrafter
from specgguf.errors import UserError

# -- alignment, token by token ----------------------------------------------------------------

PROMPT = [900, 901, 902, 903]  # the prompt's tokens: body [900..902], id_last 903
PRED = list(range(100, 160))  # a prediction of 60 distinct tokens


class Drive:
    """Feeds a PredictionDrafter the output as the engine does: history grows by the
    committed tokens, id_last is the newest one, not yet in history."""

    def __init__(self, drafter):
        self.d, self.history, self.id_last = drafter, PROMPT[:-1], PROMPT[-1]
        drafter.start(None)
        drafter.begin(list(self.history))

    def emit(self, *tokens):
        for tok in tokens:
            self.history.append(self.id_last)
            self.id_last = tok
        return self

    def draft(self, n=8):
        return self.d.draft(self.history, self.id_last, len(self.history), n)


def test_the_first_round_drafts_the_prediction_from_its_start():
    d = Drive(PredictionDrafter(PRED))
    assert d.draft(5) == PRED[:5] and d.d.source == "prediction"
    assert len(d.d.last_confidence) == 5 and 0 < d.d.last_confidence[0] < d.d.last_confidence[-1] < 1


def test_while_the_output_follows_it_the_next_tokens_are_drafted():
    d = Drive(PredictionDrafter(PRED)).emit(*PRED[:7])
    assert d.draft(4) == PRED[7:11]
    # confidence grows with how long the output has followed the prediction
    fresh = Drive(PredictionDrafter(PRED))
    fresh.draft(1)
    assert d.d.last_confidence[0] > fresh.d.last_confidence[0]


def test_an_insertion_loses_the_alignment_until_the_output_rejoins():
    d = Drive(PredictionDrafter(PRED)).emit(*PRED[:10], 7, 8, 9)  # three tokens the prediction lacks
    assert d.draft() == [] and d.d.source is None
    d.emit(PRED[10])  # one token back: one token is too common a key to trust
    assert d.draft() == []
    d.emit(PRED[11])
    assert d.draft(4) == PRED[12:16] and d.d.source == "prediction"


def test_a_deletion_realigns_forward():
    d = Drive(PredictionDrafter(PRED)).emit(*PRED[:10], *PRED[30:32])  # PRED[10:30] left out
    assert d.draft(3) == PRED[32:35]


def test_a_repeated_line_realigns_at_the_occurrence_after_the_last_alignment():
    line = [50, 51, 52, 53]
    pred = [1, 2, *line, 3, 4, 5, 6, *line, 7, 8]  # the line occurs at 2 and at 10
    d = Drive(PredictionDrafter(pred)).emit(1, 2, *line, 3, 4, 5, 6, 99, *line[:3])  # 99: an edit
    assert d.draft(3) == [53, 7, 8]  # the second occurrence, the one ahead
    d2 = Drive(PredictionDrafter(pred)).emit(1, 2, 99, *line[:3])  # the edit right at the start
    assert d2.draft(2) == [53, 3]


def test_the_engines_drafter_drafts_where_the_prediction_has_nothing():
    inner = NgramDrafter(2, 3)
    d = Drive(PredictionDrafter(PRED[:6], inner))
    d.emit(*PRED[:6], 40, 41, 42, 40, 41)  # past the prediction's end; 40 41 -> 42 in the text
    assert d.draft(3) == [42, 40, 41] and d.d.source == "drafter"
    assert d.d.last_confidence == inner.last_confidence


def test_a_prediction_the_prompt_holds_leaves_the_lookup_to_draft():
    """An edit request that quotes the file: the engine's n-gram lookup already drafts from it
    (and from the output's own text), so the prediction stands aside rather than compete."""
    d = PredictionDrafter(PRED, NgramDrafter(2, 3))
    d.start(None)
    d.begin([*PRED, 900, 901])
    assert d.redundant
    out = d.draft([*PRED, 900, 901, *PRED[:5]], PRED[5], len(PRED) + 7, 4)
    assert out == PRED[6:10] and d.source == "drafter"
    alone = PredictionDrafter(PRED, NgramDrafter(2, 3))
    alone.begin([900, 901, *PRED[:20]])  # a third of it: not held
    assert not alone.redundant


def test_drafts_stay_inside_the_batch_invariant_width():
    assert PredictionDrafter(PRED, verify_width=5).max_length == 4
    d = Drive(PredictionDrafter(PRED, verify_width=5))
    assert d.draft(16) == PRED[:4]


# -- the engine: output unchanged, drafts accepted --------------------------------------------

def _edited(tokens: list[int]) -> list[int]:
    """The tokens with a middle chunk left out and foreign ones put in: the output departs from
    such a prediction twice and rejoins it twice."""
    a, b, c = len(tokens) // 4, len(tokens) // 2, 3 * len(tokens) // 4
    return tokens[:a] + tokens[b:c] + [7, 8, 9, 10, 11] + tokens[c:]


def _generate(llm, prediction=None, **sampling):
    """A generation from PROMPT_TEXT given the prediction as tokens (the text path, which
    tokenizes it, is checked on real models below: random tokens do not survive a text round
    trip)."""
    gen, text = llm.stream_tokens(llm.tokenize(PROMPT_TEXT), 96, sampling=sampling, prediction=prediction)
    "".join(text)
    return gen


@pytest.fixture(scope="module")
def qwen_plain(qwen3_target):
    with SpecGGUF(qwen3_target, n_ctx=1024) as llm:
        yield llm


PROMPT_TEXT = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int\n    y: int\n"


@pytest.mark.parametrize("draft_max", ["auto", 6])
@pytest.mark.parametrize("draft", [None, "ngram", "suffix", "model"])
def test_greedy_output_with_a_prediction_is_plain_output(qwen_plain, qwen3_target, qwen3_draft, tmp_path,
                                                         monkeypatch, draft, draft_max):
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    want = _generate(qwen_plain).tokens
    draft = qwen3_draft if draft == "model" else draft
    with SpecGGUF(qwen3_target, draft=draft, draft_max=draft_max, n_ctx=1024) as llm:
        exact = _generate(llm, want)
        edited = _generate(llm, _edited(want))
    for got in (exact, edited):
        assert got.tokens == want
        p = got.stats.prediction
        assert p["accepted"] > 0 and p["rounds"] > 0 and p["drafted"] >= p["accepted"]
        assert got.stats.accepted >= p["accepted"]
    # a prediction the output follows whole needs few target passes
    assert exact.stats.accepted >= 0.8 * len(want) and exact.stats.rounds < 0.4 * len(want)
    assert edited.stats.accepted >= 0.5 * len(want)
    if draft is None:  # alone, the prediction drafts it all: again after each of the edit's departures
        assert exact.stats.prediction["accepted"] >= 0.8 * len(want)
        assert edited.stats.prediction["accepted"] >= 0.5 * len(want)


def test_sampled_output_with_a_seed_is_unchanged(qwen_plain):
    """A seeded sample (the coupled rule: the noise is keyed by position) does not depend on
    what was drafted."""
    want = _generate(qwen_plain, temperature=0.8, seed=7)
    got = _generate(qwen_plain, _edited(want.tokens), temperature=0.8, seed=7)
    assert got.tokens == want.tokens and got.stats.prediction["accepted"] > 0


def test_prediction_values(qwen_plain):
    parts = {"type": "content", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    r = qwen_plain.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=4, prediction=parts)
    assert r["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] >= 0
    assert "completion_tokens_details" not in qwen_plain.create_completion("hi", max_tokens=2)["usage"]
    for bad in ({"type": "text", "content": "x"}, {"content": "x"}, {"type": "content", "content": 3},
                {"type": "content", "content": [{"type": "image_url"}]}, {"type": "content", "content": "x", "y": 1},
                ["x"], 5):
        with pytest.raises(ValueError, match="prediction"):
            qwen_plain.create_completion("hi", max_tokens=2, prediction=bad)
    with pytest.raises(UserError, match="speculate=True"):
        qwen_plain.stream_tokens(qwen_plain.tokenize("hi"), 4, speculate=False, prediction=[1, 2])


# -- the server, through the real openai client -----------------------------------------------

FILE = "def load(path):\n    with open(path) as f:\n        return f.read()\n\n\ndef save(path, text):\n" \
       "    with open(path, \"w\") as f:\n        f.write(text)\n"
EDIT_PROMPT = f"Before:\n{FILE}\nAfter (the same code):\n"


@pytest.fixture(scope="module")
def invariant_server(gemma_path):
    """A plain server (no --draft) of the real Gemma 3 270M in the batch-invariant mode, where
    every verify batch computes one-token decoding's logits: a prediction cannot change a token
    (its invariant width is measured once per machine, in the user's cache, as
    test_batch_invariant's is)."""
    from serverproc import start_server

    with start_server(gemma_path, "--batch-invariant", "--ctx", "512") as server:
        yield server


def test_openai_client_predicted_outputs(invariant_server):
    import openai

    client = openai.OpenAI(base_url=invariant_server.base_url, api_key="none", max_retries=0, timeout=120)
    plain = client.completions.create(model="m", prompt=EDIT_PROMPT, max_tokens=48, temperature=0)
    predicted = client.completions.create(model="m", prompt=EDIT_PROMPT, max_tokens=48, temperature=0,
                                          extra_body={"prediction": {"type": "content", "content": FILE}})
    assert predicted.choices[0].text == plain.choices[0].text
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens >= 0
    assert predicted.model_extra["specgguf"]["prediction"]["accepted"] == details.accepted_prediction_tokens
    assert plain.usage.completion_tokens_details is None
    # Chat Completions: the SDK's own `prediction` argument, streamed as well
    messages = [{"role": "user", "content": EDIT_PROMPT}]
    want = client.chat.completions.create(model="m", messages=messages, max_tokens=32, temperature=0)
    got = client.chat.completions.create(model="m", messages=messages, max_tokens=32, temperature=0,
                                         prediction={"type": "content", "content": want.choices[0].message.content})
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.usage.completion_tokens_details.accepted_prediction_tokens > 0
    stream = client.chat.completions.create(model="m", messages=messages, max_tokens=32, temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            prediction={"type": "content", "content": FILE})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.choices[0].message.content
    assert chunks[-1].usage.completion_tokens_details is not None
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=messages, max_tokens=4,
                                       prediction={"type": "content", "content": 5})
    assert err.value.body["param"] == "prediction.content"
    assert invariant_server.alive()

