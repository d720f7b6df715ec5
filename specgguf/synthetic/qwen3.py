"""Tiny deterministic GGUF models for tests and demos: arch `qwen3`, random weights.

No small qwen3/llama model can be installed here, and hidden-state drafts (eagle3, dflash,
dspark) need a target whose graph exposes layer inputs, so tests build their own: a few
layers, random weights from a seed, and a real byte-level BPE tokenizer trained on a short
built-in text (llama.cpp requires tokens, types and merges). Same seed, same bytes.

    path = write_qwen3(tmp / "t.gguf", QwenShape(), seed=0)
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. A speculative decoder drafts a few tokens "
    "and the target model verifies them in one batch. def add(a, b):\n    return a + b\n"
    "for i in range(10):\n    print(i, i * i)\nThe cache holds keys and values; the draft "
    "proposes, the target disposes. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.\n"
    "import numpy as np\nx = np.zeros((4, 4))\nHello, world! How are you today? I am fine.\n"
)


@dataclass(frozen=True)
class QwenShape:
    n_layer: int = 4
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    n_merges: int = 250  # vocabulary = 256 bytes + merges + specials
    n_ctx_train: int = 4096
    tied: bool = False


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-ins for the 256 byte values (byte-level BPE)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def train_bpe(n_merges: int) -> tuple[list[str], list[str]]:
    """(tokens, merges) of a byte-level BPE learned greedily on the built-in corpus."""
    b2u = _bytes_to_unicode()
    words = Counter()
    for word in _CORPUS.replace("\n", " \n ").split(" "):
        if word:
            words[tuple(b2u[b] for b in (" " + word).encode())] += 1
    tokens, merges = learn_merges(words, n_merges)
    return [b2u[b] for b in range(256)] + tokens, merges


def learn_merges(words: Counter, n_merges: int) -> tuple[list[str], list[str]]:
    """(new tokens, merges): greedy BPE over `words` (symbol tuples -> counts)."""
    tokens, merges = [], []
    for _ in range(n_merges):
        pairs = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        new = Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] += c
        words = new
    return tokens, merges


def add_tokenizer(writer, n_merges: int, mask: bool = True, swap: tuple[int, int] | None = None) -> int:
    """Write the tokenizer keys; returns the vocabulary size. `mask=False` omits the mask
    token id and `swap` exchanges two token texts (same size, other vocabulary): both exist
    to test that mismatched pairs are refused."""
    tokens, merges = train_bpe(n_merges)
    if swap is not None:
        a, b = swap
        tokens[a], tokens[b] = tokens[b], tokens[a]
    types = [1] * len(tokens) + [3] * len(SPECIALS)  # 1 normal, 3 control
    tokens = tokens + SPECIALS
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(tokens.index("<|endoftext|>"))
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    if mask:
        writer.add_mask_token_id(tokens.index("<|mask|>"))
    return len(tokens)


def _initializers(seed: int):
    """(mat, norm): seeded random matrices scaled 1/sqrt(fan-in) and RMS-norm weights near 1."""
    rng = np.random.default_rng(seed)

    def mat(rows, cols, scale=None):
        return (rng.standard_normal((rows, cols)) * (scale or cols ** -0.5)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    return mat, norm


def qwen3_weights(shape: QwenShape, n_vocab: int, seed: int) -> dict[str, np.ndarray]:
    """Random weights with GGUF names; numpy shapes are (ne1, ne0) as gguf expects."""
    mat, norm = _initializers(seed)
    H, hd, I = shape.n_embd, shape.head_dim, shape.n_ff

    w = {"token_embd.weight": mat(n_vocab, H, 1.0), "output_norm.weight": norm(H)}
    if not shape.tied:
        w["output.weight"] = mat(n_vocab, H)
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(H)
        w[p + "attn_q.weight"] = mat(shape.n_head * hd, H)
        w[p + "attn_k.weight"] = mat(shape.n_head_kv * hd, H)
        w[p + "attn_v.weight"] = mat(shape.n_head_kv * hd, H)
        w[p + "attn_output.weight"] = mat(H, shape.n_head * hd)
        w[p + "attn_q_norm.weight"] = norm(hd)
        w[p + "attn_k_norm.weight"] = norm(hd)
        w[p + "ffn_norm.weight"] = norm(H)
        w[p + "ffn_gate.weight"] = mat(I, H)
        w[p + "ffn_up.weight"] = mat(I, H)
        w[p + "ffn_down.weight"] = mat(H, I)
    return w


def successor(n_vocab: int) -> np.ndarray:
    """The "counting" next-token map: t -> t+1 over the ordinary tokens, wrapping to 0 before
    the special tokens (so a counting model never emits end-of-generation)."""
    n_plain = n_vocab - len(SPECIALS)
    succ = np.zeros(n_vocab, dtype=np.int64)
    succ[:n_plain] = (np.arange(n_plain) + 1) % n_plain
    return succ


def head_for(embeddings: np.ndarray, next_of: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Output rows such that argmax(head . e_t) = next_of[t] for (near-orthogonal) rows e_t."""
    head = np.zeros_like(embeddings)
    np.add.at(head, next_of, embeddings)
    return (head * scale / np.sqrt(embeddings.shape[1])).astype(np.float32)


def write_qwen3(path, shape: QwenShape = QwenShape(), seed: int = 0, perturb: float = 0.0,
                perturb_seed: int = 1, name: str = "synthetic-qwen3", counting: bool = False,
                tokenizer: dict | None = None, chat_template: str | None = None, quant: str | None = None) -> Path:
    """Write a qwen3 GGUF; `perturb` > 0 adds that much relative noise (a similar draft).
    `quant` (a GGML type name such as "Q8_0") stores the matrices quantised by gguf's numpy
    quantiser (rows whose length the type's block does not divide stay F32).

    counting=True makes a predictable target: small layer outputs and a head that maps each
    token to its successor (see `successor`), so greedy text counts through the vocabulary
    except where the layers tip a near-tie. Drafts built to know that rule (write_eagle3 /
    write_dflash with counting=True) then get real, partial acceptance in tests."""
    import gguf

    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    writer = gguf.GGUFWriter(str(tmp), "qwen3")
    writer.add_name(name)
    writer.add_context_length(shape.n_ctx_train)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_file_type(0)
    n_vocab = add_tokenizer(writer, shape.n_merges, **(tokenizer or {}))
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    weights = qwen3_weights(shape, n_vocab, seed)
    if counting:
        weights["output.weight"] = head_for(weights["token_embd.weight"], successor(n_vocab), 4.0)
        for k in weights:
            if k.endswith(("attn_output.weight", "ffn_down.weight")):
                weights[k] *= 0.05
    if perturb > 0:
        rng = np.random.default_rng(perturb_seed)
        for k, v in weights.items():
            if v.ndim == 2:
                weights[k] = (v + perturb * v.std() * rng.standard_normal(v.shape)).astype(np.float32)
    if quant is not None:
        from gguf import quants

        qtype = gguf.GGMLQuantizationType[quant]
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        for k, v in weights.items():
            if v.ndim == 2 and v.shape[-1] % block == 0:
                weights[k] = (quants.quantize(v, qtype), quant)
    return finish_gguf(writer, weights, path, tmp)


def bigger(shape: QwenShape = QwenShape(), **changes) -> QwenShape:
    return replace(shape, **changes)


# --------------------------------------------------------------------------------------
# Hidden-state drafts for a synthetic qwen3 target (docs/gguf-formats.md §3, §4)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftShape:
    n_layer: int = 1
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    n_embd: int = 64  # eagle3 only: dflash drafts must match the target's width
    markov_rank: int = 32


def _draft_writer(path: Path, arch: str, shape: DraftShape, n_embd: int, target: QwenShape, tokenizer=None):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"synthetic-{arch}")
    w.add_context_length(target.n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1_000_000.0)
    w.add_file_type(0)
    n_vocab = add_tokenizer(w, target.n_merges, **(tokenizer or {}))  # the target's tokenizer
    return w, n_vocab


def finish_gguf(w, tensors: dict, path: Path, tmp: Path | None = None) -> Path:
    """Add `tensors` to the GGUFWriter `w` and write the file out; it was opened at `tmp`
    (then moved to `path`, so a reader never sees half a file) or at `path` itself. A value
    is an array, or (raw bytes, GGML type name) for blocks quantised already."""
    import gguf

    for k, v in tensors.items():
        if isinstance(v, tuple):
            w.add_tensor(k, v[0], raw_dtype=gguf.GGMLQuantizationType[v[1]])
        elif v.dtype == np.int64:
            w.add_tensor(k, v, raw_dtype=gguf.GGMLQuantizationType.I64)
        else:
            w.add_tensor(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if tmp is not None:
        os.replace(tmp, path)
    return path


def write_eagle3(path, target: QwenShape = QwenShape(), layers=(1, 2, 3), shape: DraftShape = DraftShape(),
                 seed: int = 10, own_head: bool = True, counting_target_seed: int | None = None,
                 target_hidden_size: int | None = None, tokenizer: dict | None = None,
                 qk_norm: bool = False, gemma_layer: bool = False) -> Path:
    """A 1-layer EAGLE-3 draft (llama.cpp's `eagle3` arch) reading `layers` target layer inputs
    (3 for classic EAGLE-3; other counts, `qk_norm` and `gemma_layer` need the patched build,
    docs/patches.md). gemma_layer: Gemma 4's layer (K = V without attn_v, post-attention and
    post-FFN norms, layer scalar, GELU-tanh, embedding and attention scales, soft-capping).

    counting_target_seed: the seed of a counting target (write_qwen3(counting=True)); the
    draft then passes the target's features straight through (fc averages the layers,
    attention and MLP add nothing) and its head predicts the successor of the successor,
    which is right for the first draft token of a round: real partial acceptance."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    w, n_vocab = _draft_writer(tmp, "eagle3", shape, shape.n_embd, target, tokenizer)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_array("eagle3.target_layers", [int(x) for x in layers])
    w.add_uint32("eagle3.target_hidden_size", target_hidden_size or target.n_embd)
    w.add_bool("eagle3.norm_before_residual", False)
    mat, norm = _initializers(seed)
    H, Ht, hd = shape.n_embd, target_hidden_size or target.n_embd, shape.head_dim

    t = {"fc.weight": mat(H, len(layers) * Ht), "output_norm.weight": norm(H),
         "blk.0.attn_norm.weight": norm(H), "blk.0.attn_norm_2.weight": norm(H),
         "blk.0.attn_q.weight": mat(shape.n_head * hd, 2 * H),
         "blk.0.attn_k.weight": mat(shape.n_head_kv * hd, 2 * H),
         "blk.0.attn_v.weight": mat(shape.n_head_kv * hd, 2 * H),
         "blk.0.attn_output.weight": mat(H, shape.n_head * hd),
         "blk.0.ffn_norm.weight": norm(H), "blk.0.ffn_gate.weight": mat(shape.n_ff, H),
         "blk.0.ffn_up.weight": mat(shape.n_ff, H), "blk.0.ffn_down.weight": mat(H, shape.n_ff)}
    if qk_norm:
        t["blk.0.attn_q_norm.weight"], t["blk.0.attn_k_norm.weight"] = norm(hd), norm(hd)
    if gemma_layer:
        del t["blk.0.attn_v.weight"]
        t["blk.0.post_attention_norm.weight"], t["blk.0.post_ffw_norm.weight"] = norm(H), norm(H)
        t["blk.0.layer_output_scale.weight"] = np.array([0.5], dtype=np.float32)
        w.add_string("eagle3.hidden_activation", "gelu_pytorch_tanh")
        w.add_float32("eagle3.embedding_scale", float(np.sqrt(H)))
        w.add_float32("eagle3.attention.scale", 1.0)
        w.add_float32("eagle3.final_logit_softcapping", 30.0)
    if own_head:
        t["token_embd.weight"] = mat(n_vocab, H, 1.0)
        t["output.weight"] = mat(n_vocab, H)
    if counting_target_seed is not None:
        assert H == Ht, "a counting eagle3 draft passes target features through: equal widths"
        emb = qwen3_weights(target, n_vocab, counting_target_seed)["token_embd.weight"]
        succ = successor(n_vocab)
        t["fc.weight"] = np.tile(np.eye(H, dtype=np.float32), (1, len(layers))) / len(layers)
        t["blk.0.attn_output.weight"][:] = 0
        t["blk.0.ffn_down.weight"][:] = 0
        t["token_embd.weight"] = emb
        t["output.weight"] = head_for(emb, succ[succ], 4.0)
    return finish_gguf(w, t, path, tmp)


def write_dflash(path, target: QwenShape = QwenShape(), layers=(1, 2, 3), shape: DraftShape = DraftShape(),
                 seed: int = 20, block_size: int = 8, own_head: bool = True, markov: bool = False,
                 confidence: bool = False, sample_from_anchor: bool | None = None, counting: bool = False,
                 tokenizer: dict | None = None) -> Path:
    """A DFlash draft (arch `dflash`), or with `markov=True` a DSpark one (Markov head, and a
    confidence head with `confidence=True`). Its width is the target's (docs/gguf-formats.md §3).

    counting=True (with markov=True): the Markov head encodes the counting target's
    successor rule and outweighs the draft's own logits, so the chained slots count too."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    H, hd = target.n_embd, shape.head_dim
    w, n_vocab = _draft_writer(tmp, "dflash", shape, H, target, tokenizer)
    w.add_array("dflash.target_layers", [int(x) for x in layers])
    w.add_uint32("dflash.block_size", block_size)
    if sample_from_anchor is not None:
        w.add_bool("dflash.sample_from_anchor", sample_from_anchor)
    if markov:
        w.add_bool("dflash.has_confidence_head", confidence)
    mat, norm = _initializers(seed)

    t = {"fc.weight": mat(H, len(layers) * H), "enc.output_norm.weight": norm(H), "output_norm.weight": norm(H)}
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        t.update({p + "attn_norm.weight": norm(H), p + "attn_q.weight": mat(shape.n_head * hd, H),
                  p + "attn_k.weight": mat(shape.n_head_kv * hd, H), p + "attn_v.weight": mat(shape.n_head_kv * hd, H),
                  p + "attn_output.weight": mat(H, shape.n_head * hd), p + "attn_q_norm.weight": norm(hd),
                  p + "attn_k_norm.weight": norm(hd), p + "ffn_norm.weight": norm(H),
                  p + "ffn_gate.weight": mat(shape.n_ff, H), p + "ffn_up.weight": mat(shape.n_ff, H),
                  p + "ffn_down.weight": mat(H, shape.n_ff)})
    if own_head:
        t["token_embd.weight"] = mat(n_vocab, H, 1.0)
        t["output.weight"] = mat(n_vocab, H)
    if markov:
        R = shape.markov_rank
        t["markov_w1.weight"] = mat(n_vocab, R, 1.0)
        t["markov_w2.weight"] = mat(n_vocab, R)
        if counting:
            t["markov_w2.weight"] = head_for(t["markov_w1.weight"], successor(n_vocab), 40.0)
            if "output.weight" in t:
                t["output.weight"] *= 0.01
        if confidence:
            t["conf_proj.weight"] = mat(1, H + R)
            t["conf_proj.bias"] = np.array([0.5], dtype=np.float32)
    return finish_gguf(w, t, path, tmp)
