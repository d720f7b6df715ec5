"""DFlash 2 drafts (issue 43): a `dflash` file with a top-K candidate selector
(`dflash.selector_top_k` > 0) is drafted as llama.cpp's driver drafts it: one block
[id_last, mask...] decoded without logits, the selector lattice read from the unmasked nextn
rows, and the greedy walk through it (drafters/dflash.py, docs/loop.md §4.4.1).

Drafts are synthetic DFlash2DraftModel checkpoints (tests/checkpoint_fixtures.py) converted by
specgguf's converter: a random one, whose drafts are rarely accepted, and a counting one built
so that its selector chains the counting target's successor rule (real partial acceptance).
The numpy reference (tests/reference_dflash2.py) is written from the checkpoint's PyTorch
semantics; llama-speculative-simple `--spec-type draft-dflash` is the oracle for the rounds.
"""

from __future__ import annotations

import dataclasses
import json

import gguf
import numpy as np
import pytest

import checkpoint_fixtures as F
import cpp_baseline
import reference_dflash2 as R2
from test_parallel import together
from specgguf.api import SpecGGUF
from specgguf.converters import convert
from specgguf.converters.safetensors import Weights
from specgguf.decoding.engine import Engine
from specgguf.decoding.promptcache import MIN_REUSE
from specgguf.decoding.sampling import SamplingParams
from specgguf.drafters import make_drafter
from specgguf.drafters.dflash import walk_lattice
from specgguf.runtime import native
from specgguf.runtime.target import Target
from specgguf.synthetic.qwen3 import SPECIALS, successor, write_dflash

K = 4  # selector_top_k of both drafts
BLOCK = 8  # dflash.block_size: up to 7 drafts a block (in-place slots)
PROMPT = "hello world, the draft"
N = 32
TEXTS = ("the draft proposes, the target disposes", "def add(a, b):\n    return a + b",
         "The quick brown fox jumps over the lazy dog.")


# -- drafts ---------------------------------------------------------------------------------

def random_checkpoint(directory, spec):
    """A DFlash2DraftModel checkpoint with random weights: kernel 3, group 16, rank 8, top 4;
    dynamic taps ten times the fixture's, so that they weigh in the convolutions."""
    cfg = F.dspark_config(spec, markov_rank=0, conf=False, block_size=BLOCK)
    cfg, t = F.community_layout("dflash2", cfg, F.dspark_tensors(spec, cfg), conv=(3, 16), selector=(8, K))
    for name in t:
        if name.endswith("kernel_projection.weight"):
            t[name] = t[name] * 10
    return F.write_checkpoint(directory, cfg, t, "F32")


def counting_checkpoint(directory, spec, rank=32, seed=7):
    """A one-layer DFlash2DraftModel whose selector counts: at every mask slot the block's
    final hidden state is the anchor's embedding (up to a positive factor), its head's K best
    candidates there are the anchor's K successors, and the selector prefers succ(prev) after
    prev, so the walk drafts succ(a), succ(succ(a)), ... for the counting target.

    Channels 0..47 (A) carry token identity, 48..63 (B) a constant: ordinary embeddings live
    in A, the mask's in B. In the one attention layer (2 heads of 64, 2 KV heads) a mask slot's
    query (from B) points along the slowest RoPE pair; the anchor's key is +-(v . e_anchor)
    along it, KV head 1 the opposite of head 0, so one of the two heads always locks onto the
    anchor, whose value (its A channels) both heads write back; every other key and value is
    zero (the mask has nothing in A, and hidden_norm zeroes A in the context). No MLP, identity
    convolutions. The gate reads B, so it is positive, and predecessor . successor codebooks
    are 1 for a counting pair and noise otherwise."""
    H, V = spec.n_embd, spec.n_vocab
    A, B, nA = slice(0, 48), slice(48, H), 48
    hd, d = 64, 31  # NeoX pairs (i, i + 32): i = 31 turns slowest
    wide = dataclasses.replace(spec, n_head=2, n_head_kv=2, head_dim=hd)
    cfg = F.dspark_config(wide, n_layer=1, markov_rank=0, conf=False, block_size=BLOCK)
    cfg, t = F.community_layout("dflash2", cfg, F.dspark_tensors(wide, cfg), conv=(2, 16), selector=(rank, K))
    rng = np.random.default_rng(seed)
    n_plain = V - len(SPECIALS)
    pred = np.zeros(V, dtype=np.int64)
    pred[successor(V)[:n_plain]] = np.arange(n_plain)
    emb = np.zeros((V, H), np.float32)
    emb[:, A] = rng.normal(0, 1, (V, nA))
    emb[spec.mask_id] = 0
    emb[spec.mask_id, B] = 1
    unit = emb[:, A] / np.linalg.norm(emb[:, A], axis=1, keepdims=True).clip(1e-9)
    head = np.zeros((V, H), np.float32)
    back = np.arange(n_plain)
    for _ in range(K):  # logit(t) = sum_k e_{pred^k(t)} . h: high for the anchor's K successors
        back = pred[back]
        head[:n_plain, A] += unit[back]
    t["embed_tokens.weight"], t["lm_head.weight"] = emb, head
    L = "layers.0."
    for name in ("input_layernorm", "post_attention_layernorm"):
        t[L + name + ".weight"] = np.ones(H, np.float32)
    t["norm.weight"] = np.ones(H, np.float32)
    for m in ("attention_conv", "mlp_conv"):
        base = np.zeros_like(t[L + m + ".base_kernel"])
        base[:, 0] = 1
        t[L + m + ".base_kernel"] = base
        t[L + m + ".kernel_projection.weight"] = np.zeros_like(t[L + m + ".kernel_projection.weight"])
    q, k, v = (np.zeros((2 * hd, H), np.float32) for _ in range(3))
    o = np.zeros((H, 2 * hd), np.float32)
    vec = rng.normal(0, 1, nA)
    vec *= 8 / np.linalg.norm(vec)
    for h in range(2):
        q[h * hd + d, B] = 1
        k[h * hd + d, A] = vec if h == 0 else -vec
        v[h * hd + np.arange(nA), np.arange(nA)] = 1
        o[np.arange(nA), h * hd + np.arange(nA)] = 1
    t.update({L + "self_attn.q_proj.weight": q, L + "self_attn.k_proj.weight": k,
              L + "self_attn.v_proj.weight": v, L + "self_attn.o_proj.weight": o})
    qk_norm = np.ones(hd, np.float32)
    qk_norm[d] = 2.5  # attention logit +-50 on the anchor
    t[L + "self_attn.q_norm.weight"], t[L + "self_attn.k_norm.weight"] = qk_norm, qk_norm.copy()
    t[L + "mlp.down_proj.weight"] = np.zeros_like(t[L + "mlp.down_proj.weight"])
    t["hidden_norm.weight"] = np.zeros(H, np.float32)
    t["hidden_norm.weight"][B] = 1
    E = rng.normal(0, 1, (V, rank))
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    succ_cb = np.zeros((V, rank))
    succ_cb[:n_plain] = E[pred[:n_plain]]
    t["candidate_selector.predecessor_codebook"] = E.astype(np.float32)
    t["candidate_selector.successor_codebook"] = succ_cb.astype(np.float32)
    gate = np.zeros((rank, H), np.float32)
    gate[:, B] = 40 / 16
    t["candidate_selector.hidden_projection.weight"] = gate
    return F.write_checkpoint(directory, cfg, t, "F32")


@pytest.fixture(scope="module")
def random_ck(tmp_path_factory, qwen3_target):
    return random_checkpoint(tmp_path_factory.mktemp("dflash2-random"), F.qwen3_target_spec(qwen3_target))


@pytest.fixture(scope="module")
def random_draft(random_ck, qwen3_target):
    out = convert(str(random_ck), qwen3_target, random_ck.parent / "random.gguf", "f32")
    assert out.kind == "dflash2" and out.head == "shared"
    return str(out.path)


@pytest.fixture(scope="module")
def counting_draft(tmp_path_factory, counting_target):
    d = tmp_path_factory.mktemp("dflash2-counting")
    out = convert(str(counting_checkpoint(d / "ck", F.qwen3_target_spec(counting_target))), counting_target,
                  d / "counting.gguf", "f32", "own")
    assert out.kind == "dflash2" and out.summary["head"] == "own"
    return str(out.path)


@pytest.fixture(scope="module")
def pairs(qwen3_target, counting_target, random_draft, counting_draft):
    return {"random": (qwen3_target, random_draft), "counting": (counting_target, counting_draft)}


def checkpoint_weights(directory, target) -> dict:
    """The checkpoint's tensors as float32, with the target's tables where it has none."""
    with Weights(directory) as w:
        out = {n: w[n].float32() for n in w.names()}
    tables = {t.name: t for t in gguf.GGUFReader(target).tensors}
    for mine, theirs in (("embed_tokens.weight", "token_embd.weight"), ("lm_head.weight", "output.weight")):
        if mine not in out:
            t = tables[theirs]
            out[mine] = np.asarray(t.data, dtype=np.float32).reshape(int(t.shape[1]), int(t.shape[0]))
    return out


def generate(target, drafter, n_draft, prompt=PROMPT, n=N, sampling=None):
    gen = Engine(target, drafter, n_draft).generate(target.tokenize(prompt), n, sampling=sampling)
    for _ in gen:
        pass
    return gen


# -- the walk -------------------------------------------------------------------------------

def test_walk_follows_the_chosen_predecessor_and_stops_at_p_min():
    """Row i's scores are read at the predecessor chosen at i - 1, by its index in the
    candidates of i - 1; ties go to the first; p_min is the softmax of those K scores."""
    k = 3
    rows = np.zeros((4, 12 + k * (k + 1)), np.float32)
    rows[1, :k] = [10, 11, 12]
    rows[1, k:k + k * k] = np.tile([0.0, 5.0, 1.0], k)  # after the anchor: candidate 1 (11)
    rows[2, :k] = [20, 21, 22]
    rows[2, k:k + k * k] = [9, 9, 9,  # after candidate 0 (not chosen)
                            1.0, 1.0, 3.0,  # after candidate 1: 22, index 2
                            9, 9, 9]
    rows[3, :k] = [30, 31, 32]
    rows[3, k:k + k * k] = [9, 9, 9, 9, 9, 9,
                            2.0, 2.0, 0.0]  # after index 2: a tie, the first (30)
    assert walk_lattice(rows, k) == [11, 22, 30]
    # softmax at the argmax: row 1 1/(1+e^-5+e^-4) = 0.976, row 2 0.787, row 3 0.468
    assert walk_lattice(rows, k, p_min=0.5) == [11, 22]
    assert walk_lattice(rows, k, p_min=0.9) == [11]
    assert walk_lattice(rows, k, p_min=0.99) == []
    assert walk_lattice(rows[:1], k) == []


def test_dflash2_files_are_detected(qwen3_target, random_draft, tmp_path):
    plain = write_dflash(tmp_path / "dflash.gguf")
    with Target(qwen3_target, n_ctx=128) as tgt:
        for path, is2 in ((random_draft, True), (str(plain), False)):
            drafter = make_drafter(path, tgt, draft_max=4)
            try:
                assert drafter.kind == "dflash" and drafter.dflash2 is is2
                assert drafter.selector_top_k == (K if is2 else 0)
                assert ("DFlash 2 selector (top 4)" in drafter.describe()) is is2
            finally:
                drafter.close()


# -- the reference ----------------------------------------------------------------------------

def _block(draft, target_ctx, feats, tokens):
    """Inject `feats` at 0..P-1, decode the block at P as the drafter does (nextn unmasked),
    with logits too (they change nothing in the graph); logits, lattice rows."""
    with native.Model(draft) as m, native.Context(m, n_ctx=64, n_batch=32, ctx_other=target_ctx) as c:
        c.set_causal(False)
        c.set_embeddings_nextn(True, False)
        b = native.Batch(c)
        b.add_embeddings(feats, 0)
        c.decode(b)
        b.clear().add_tokens(tokens, len(feats), "all")
        c.decode(b)
        logits = np.stack([c.logits(i).copy() for i in range(len(tokens))])
        rows = c.embeddings_nextn(len(tokens), m.n_embd)
        b.close()
    return logits, rows


def assert_walks_the_lattice(walk, lat, what) -> None:
    """`walk` (llama.cpp's) step by step in the reference's lattice: each choice is the best
    after the predecessor it chose, or within a near-tie of it (llama.cpp's K/V cells are F16:
    a near-tie may go the other way, and the paths part there)."""
    prev = 0
    for p, tok in enumerate(walk, start=1):
        cand, scores = lat[p - 1]
        row = scores[0 if p == 1 else prev]
        prev = cand.tolist().index(tok)
        assert row.max() - row[prev] <= 0.01 * np.abs(row).max(), (what, p)


def test_reference_agrees_with_llama_cpp(random_ck, random_draft, qwen3_target):
    """llama.cpp's graph on the converted file and the PyTorch-semantics reference on the
    checkpoint: the same logits, the same K candidates per position, the same K x K scores
    (predecessor-major, in llama.cpp's candidate order), the same greedy path (or one that
    parts at a near-tie), at block lengths 8, 4 and 2 (the selector runs over the block as
    decoded)."""
    cfg = json.loads((random_ck / "config.json").read_text())
    w = checkpoint_weights(random_ck, qwen3_target)
    spec = F.qwen3_target_spec(qwen3_target)
    rng = np.random.default_rng(11)
    worst = {"logits": 0.0, "scores": 0.0}
    paths = same = 0
    with native.Model(qwen3_target) as tm, native.Context(tm, n_ctx=64, n_batch=32) as tc:
        for trial in range(6):
            bs = (8, 4, 2)[trial % 3]
            P = int(rng.integers(3, 12))
            feats = rng.normal(0, 1, (P, 3 * spec.n_embd)).astype(np.float32)
            anchor = int(rng.integers(0, spec.n_vocab - len(SPECIALS)))
            got_logits, rows = _block(random_draft, tc, feats, [anchor] + [spec.mask_id] * (bs - 1))
            logits, h = R2.dflash2_block(w, cfg, feats, anchor, bs)
            worst["logits"] = max(worst["logits"], np.abs(got_logits - logits).max() / np.abs(logits).max())
            assert np.all(rows[0] == 0) and np.all(rows[1:, K + K * K:] == 0)
            order_prev, lat = None, R2.lattice(w, logits, h, anchor, K)
            for p, (cand, scores) in enumerate(lat, start=1):
                got = rows[p, :K]
                assert np.array_equal(got, np.round(got))
                got = got.astype(int)
                assert set(got.tolist()) == set(cand.tolist()), (trial, p, got, cand)
                order = [cand.tolist().index(g) for g in got]  # llama.cpp's order in the reference's
                want = np.repeat(scores[:, order], K, 0) if p == 1 else scores[np.ix_(order_prev, order)]
                got_scores = rows[p, K:K + K * K].reshape(K, K)  # [predecessor j, candidate i]
                worst["scores"] = max(worst["scores"], np.abs(got_scores - want).max() / np.abs(want).max())
                order_prev = order
            walk, path = walk_lattice(rows, K), R2.select(w, logits, h, anchor, K)
            assert_walks_the_lattice(walk, lat, trial)
            assert len(walk) == bs - 1
            same += walk == path
            paths += len(set(path)) > 1
    # F32 weights, but llama.cpp keeps K and V in F16 (and the dynamic taps, up to ~2 here,
    # amplify it): 2.5e-3 of the largest logit at most; taking the taps at the source position
    # instead of the output position would be off by the logits' own size
    assert worst["logits"] < 5e-3 and worst["scores"] < 5e-3, worst
    assert same >= 5 and paths > 0  # some path is not one token repeated


def test_the_drafter_drafts_the_references_path(random_ck, random_draft, qwen3_target):
    """End to end through the drafter: the target's own layer inputs of a prompt go in through
    process(), and draft() returns the reference's greedy path over those features."""
    cfg = json.loads((random_ck / "config.json").read_text())
    w = checkpoint_weights(random_ck, qwen3_target)
    with Target(qwen3_target, n_ctx=128) as tgt:
        drafter = make_drafter(random_draft, tgt, draft_max=BLOCK - 1)
        try:
            same = 0
            for text in TEXTS:
                drafter.reset()
                tgt.ctx.clear()
                toks = tgt.tokenize(text)
                b = tgt.batch
                b.clear().add_tokens(toks[:-1], 0, "none")
                tgt.ctx.decode(b)
                feats = drafter.features(len(toks) - 1).copy()
                drafter.process(toks[:-1], 0)
                got = drafter.draft(toks[:-1], toks[-1], len(toks) - 1, BLOCK - 1)
                logits, h = R2.dflash2_block(w, cfg, feats, toks[-1], BLOCK)
                assert len(got) == BLOCK - 1
                assert_walks_the_lattice(got, R2.lattice(w, logits, h, toks[-1], K), text)
                same += got == R2.select(w, logits, h, toks[-1], K)
            assert same >= len(TEXTS) - 1
        finally:
            drafter.close()


# -- lossless, and it drafts ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["random", "counting"])
def test_greedy_output_is_plain_output(pairs, name):
    target, draft = pairs[name]
    with Target(target, n_ctx=256) as tgt:
        plain = generate(tgt, None, 1).tokens
        for n in (1, 3, 7, "auto"):  # auto: each round's length sets the block
            drafter = make_drafter(draft, tgt, draft_max=n)
            try:
                assert drafter.dflash2
                gen = generate(tgt, drafter, n)
            finally:
                drafter.close()
            assert gen.tokens == plain, (name, n)
            if n != "auto":
                assert gen.stats.drafted > 0
                if name == "counting":
                    assert gen.stats.accepted > 0


def test_counting_draft_is_accepted_as_designed(counting_target, counting_draft):
    """Its candidates hold the anchor's K successors and no more: drafts of K are often
    accepted whole, and a position past K never is."""
    with Target(counting_target, n_ctx=256) as tgt:
        drafter = make_drafter(counting_draft, tgt, draft_max=BLOCK - 1)
        try:
            gen = generate(tgt, drafter, BLOCK - 1, n=48)
        finally:
            drafter.close()
    rounds = gen.stats.rounds_detail
    assert max(k for _, k in rounds) == K
    assert sum(k == K for _, k in rounds) >= len(rounds) // 3, rounds


@pytest.mark.parametrize("name", ["random", "counting"])
def test_seeded_sampling_is_plain_sampling(pairs, name):
    """The selector's draft is a point mass: the coupled and exact rules keep the target's own
    keyed sample, so each seed gives plain sampling's text."""
    target, draft = pairs[name]
    configs = [dict(temperature=0.8, top_k=40, top_p=0.95, seed=3), dict(temperature=1.0, seed=4)]

    def run(llm, **sp):
        gen = llm.engine.generate(llm.tokenize(PROMPT), N, sampling=SamplingParams(**sp))
        return list(gen), gen.stats

    with SpecGGUF(str(target), n_ctx=256) as llm:
        want = [run(llm, **c)[0] for c in configs]
    drafted = 0
    with SpecGGUF(str(target), draft=draft, draft_max=4, n_ctx=256) as llm:
        for c, tokens in zip(configs, want):
            for accept in ("coupled", "exact"):
                got, stats = run(llm, accept=accept, **c)
                assert got == tokens, (name, c, accept)
                drafted += stats.drafted
    if name == "random":  # sampled text differs between seeds here
        assert want[0] != want[1]
    assert drafted > 0


# -- parity with llama-speculative-simple ---------------------------------------------------------

def parity_rounds(target, draft, tmp_path, draft_max=4, p_min=None, n_predict=40, spec_type="draft-dflash"):
    """Greedy rounds of specgguf and llama-speculative-simple on one pair: asserts they agree
    (rounds while the budget caps both alike, each round's closing token, the text) and
    returns ours. Used for the converted community layouts too (test_convert_community.py)."""
    from test_parity import PROMPT_EN, THREADS, run_specgguf

    cpp_baseline.require_tool()
    extra_cpp = ("--spec-draft-p-min", str(p_min)) if p_min else ()
    extra_ours = ("--draft-p-min", str(p_min)) if p_min else ()
    cpp = cpp_baseline.run_speculative_simple(target, draft, PROMPT_EN, n_predict=n_predict, n_ctx=1024,
                                              draft_max=draft_max, threads=THREADS, spec_type=spec_type,
                                              workdir=tmp_path, extra_args=extra_cpp)
    ours = run_specgguf(target, draft, PROMPT_EN, n_predict=n_predict, n_ctx=1024, draft_max=draft_max,
                        extra=extra_ours)
    assert cpp.rounds, cpp.stderr[-2000:]
    assert ours["stats"]["prompt_tokens"] == cpp.prompt_tokens
    assert cpp.n_drafted == sum(r.drafted for r in cpp.rounds) and cpp.n_accept == sum(r.accepted for r in cpp.rounds)
    m = cpp.budget_rounds()
    cpp_rounds = [[r.drafted, r.accepted] for r in cpp.rounds]
    rounds = ours["stats"]["rounds_detail"]
    assert rounds[:m] == cpp_rounds[:m], (rounds, cpp_rounds)
    # the DFlash 2 branch prints no candidates, so the tokens come from the rounds: the target's
    # token that closes each round is the same, and so is the text
    tokens, at = ours["tokens"], 0
    for (_, k), r in zip(rounds[:m], cpp.rounds[:m]):
        at += k + 1
        if at <= len(tokens):
            assert tokens[at - 1] == r.last
    assert ours["text"] in cpp.output
    return rounds[:m]


@pytest.mark.parametrize("name,draft_max", [("random", 4), ("counting", 4), ("counting", 7), ("lfm2", 4),
                                            ("qwen35", 4)])
def test_rounds_match_llama_cpp(pairs, name, draft_max, request, tmp_path):
    """Greedy, -n 40: the same (drafted, accepted) every round. lfm2/qwen35: the counting draft
    on the counting hybrids, where both loops take rejected tails back by snapshots."""
    if name in ("lfm2", "qwen35"):
        target, draft = request.getfixturevalue(f"{name}_target"), pairs["counting"][1]
    else:
        target, draft = pairs[name]
    rounds = parity_rounds(target, draft, tmp_path, draft_max=draft_max)
    assert sum(n for n, _ in rounds) > 0
    if name != "random":
        assert sum(k for _, k in rounds) > 0 and any(k < n for n, k in rounds)


def test_p_min_cuts_where_llama_cpp_cuts(pairs, tmp_path):
    """--draft-p-min on DFlash 2 is the selector's softmax at its choice (not the logits')."""
    target, draft = pairs["random"]
    rounds = parity_rounds(target, draft, tmp_path, draft_max=7, p_min=0.4)
    assert len({n for n, _ in rounds}) >= 4, rounds  # the cut varies from round to round


# -- the prompt cache, parallel slots, hybrid targets ------------------------------------------------

@pytest.mark.parametrize("name", ["random", "counting"])
def test_prompt_cache_reuse_equals_fresh(pairs, name):
    target, draft = pairs[name]
    first = ("The quick brown fox jumps over the lazy dog. A speculative decoder drafts a few tokens "
             "and the target model verifies them in one batch. The cache holds keys and values")
    longer = first + "; the draft proposes, the target"
    with SpecGGUF(str(target), draft=draft, draft_max=4, n_ctx=256) as fresh:
        want = fresh.generate(longer, max_tokens=N)
    with SpecGGUF(str(target), draft=draft, draft_max=4, n_ctx=256) as llm:
        llm.generate(first, max_tokens=N)
        got = llm.generate(longer, max_tokens=N)
    assert got.stats.cached_tokens >= MIN_REUSE  # the draft's cache was kept, and trimmed, too
    assert got.tokens == want.tokens and got.text == want.text
    assert got.stats.drafted > 0 and (got.stats.drafted, got.stats.accepted) == \
        (want.stats.drafted, want.stats.accepted)


@pytest.mark.parametrize("name", ["random", "counting"])
def test_parallel_slots_answer_as_alone(pairs, name):
    target, draft = pairs[name]
    prompts = ["one two three four five six", "the cat sat on the mat and the"]
    with SpecGGUF(str(target), draft=draft, draft_max=4, n_ctx=256) as ref:
        want = [ref.generate(p, max_tokens=N) for p in prompts]
    with SpecGGUF(str(target), draft=draft, draft_max=4, n_ctx=256, n_parallel=2) as llm:
        got = together(llm, prompts, max_tokens=N)
        assert len({id(e.drafter.model) for e in llm._pool.engines}) == 1  # one draft model
    assert [r.tokens for r in got] == [r.tokens for r in want]
    # each slot walked its own lattice: the same drafts, accepted as often, as alone
    assert [(r.stats.drafted, r.stats.accepted) for r in got] == [(r.stats.drafted, r.stats.accepted) for r in want]
    assert sum(r.stats.drafted for r in got) > 0
    if name == "counting":
        assert sum(r.stats.accepted for r in got) > 0


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_hybrid_targets_are_lossless(arch, request, counting_draft):
    """The counting draft (it reads no target feature) on the counting hybrids: greedy output is
    plain output at a fixed length and auto, drafts are accepted and rejected tails taken back
    by recurrent-state snapshots; test_rounds_match_llama_cpp compares the rounds."""
    target = str(request.getfixturevalue(f"{arch}_target"))
    with SpecGGUF(target, n_ctx=256) as llm:
        plain = llm.generate(PROMPT, max_tokens=N).tokens
    for n in (4, "auto"):
        with SpecGGUF(target, draft=counting_draft, draft_max=n, n_ctx=256) as llm:
            got = llm.generate(PROMPT, max_tokens=N)
        assert got.tokens == plain, (arch, n)
        if n == 4:
            rb = got.stats.rollback
            assert got.stats.accepted > 0 and any(k < d for d, k in got.stats.rounds_detail)
            assert rb["mode"] == "snapshots" and rb["snapshot_rollbacks"] > 0, rb
