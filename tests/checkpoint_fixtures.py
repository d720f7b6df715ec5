"""Makers of tiny synthetic checkpoints and targets for the converter tests (numpy only).

- `make_target_gguf`: a qwen3-arch target GGUF with random weights and a real (small) GPT-2
  style BPE tokenizer section, loadable by llama.cpp.
- `make_dspark_checkpoint`: a DeepSpec-format DFlash/DSpark checkpoint (Qwen3 or Gemma 4
  backbone; BF16 by default; optionally sharded), laid out as DeepSpec's trainer saves it.
- `make_eagle3_checkpoint`: a standard (SpecForge-style) EAGLE-3 checkpoint with d2t.
- `make_deepspec_eagle3_checkpoint`: a DeepSpec Eagle3 checkpoint (5 layers, q/k norms).
- `make_gemma4_eagle3_checkpoint`: a Gemma4Eagle3Model checkpoint for a synthetic gemma4 target.
- `write_safetensors`: the safetensors format by hand (8-byte header length, JSON, data).
- `qwen3_target_spec`, `make_community_checkpoint`: the community DFlash/DSpark/DFlash 2
  layouts (SpecForge, speculators, LiquidAI, Ling, z-lab) of the same DeepSpec weights, for a
  synthetic qwen3 target (specgguf.synthetic.write_qwen3); `write_torch_pt`: a torch.save zip
  archive written without torch (mask_embedding.pt).

Weights are random but deterministic (seeded). The checkpoint's embeddings and head are the
target's own values, as in real DeepSpec checkpoints (frozen copies of the target's).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import gguf

# --------------------------------------------------------------------------------------
# safetensors
# --------------------------------------------------------------------------------------


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (round to nearest even), as uint16."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_round(x: np.ndarray) -> np.ndarray:
    return (to_bf16_bits(x).astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path: Path, tensors: dict, dtype: str = "BF16") -> None:
    """Write float arrays in `dtype` (BF16/F16/F32); int64 arrays are written as I64."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        if arr.dtype == np.int64:
            data, dt = arr.astype("<i8").tobytes(), "I64"
        elif arr.dtype == np.bool_:
            data, dt = arr.astype(np.uint8).tobytes(), "BOOL"
        elif dtype == "BF16":
            data, dt = to_bf16_bits(arr).tobytes(), "BF16"
        elif dtype == "F16":
            data, dt = arr.astype("<f2").tobytes(), "F16"
        else:
            data, dt = arr.astype("<f4").tobytes(), "F32"
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for b in blobs:
            fh.write(b)


def write_checkpoint(directory: Path, config: dict, tensors: dict, dtype="BF16", shards: int = 1) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    if shards == 1:
        write_safetensors(directory / "model.safetensors", tensors, dtype)
        return directory
    names = list(tensors)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        write_safetensors(directory / fname, part, dtype)
        weight_map.update({n: fname for n in part})
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return directory


# --------------------------------------------------------------------------------------
# target GGUF (qwen3 arch, GPT-2 BPE tokenizer)
# --------------------------------------------------------------------------------------


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]


def make_vocab(n_vocab: int):
    """tokens, token types and merges of a small byte-level BPE vocabulary of n_vocab tokens."""
    byte_chars = list(_bytes_to_unicode().values())
    tokens, merges = list(byte_chars), []
    words = ["the", "and", "ing", "to", "of", "in", "is", "it", "on", "at", "er", "re", "ed",
             "hello", "world", "draft", "token", "model", "speculative", "decoding"]
    seen = set(tokens)
    for w in words:  # merges that build each word from the left
        cur = w[0]
        for ch in w[1:]:
            new = cur + ch
            if new not in seen and len(tokens) < n_vocab - len(SPECIALS):
                merges.append(f"{cur} {ch}")
                tokens.append(new)
                seen.add(new)
            cur = new
    for w in words:
        sp = "Ġ" + w
        if sp not in seen and w in seen and len(tokens) < n_vocab - len(SPECIALS):
            merges.append(f"Ġ {w}")
            tokens.append(sp)
            seen.add(sp)
    i = 0
    while len(tokens) < n_vocab - len(SPECIALS):  # padding tokens, as in padded Qwen vocabularies
        tokens.append(f"[PAD{i}]")
        i += 1
    types = [1] * len(tokens)
    for s in SPECIALS:
        tokens.append(s)
        types.append(3)
    return tokens, types, merges


@dataclass
class TargetSpec:
    n_vocab: int = 320
    n_embd: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_ff: int = 128
    rope_theta: float = 1e6
    eps: float = 1e-6
    seed: int = 0

    @property
    def mask_id(self) -> int:
        return self.n_vocab - 1  # "<|mask|>"


def target_arrays(spec: TargetSpec) -> dict:
    """The target's weights (numpy order [out, in]); embeddings and head are reused by drafts."""
    rng = np.random.default_rng(spec.seed)
    H, q, kv = spec.n_embd, spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim
    w = {"token_embd.weight": rng.normal(0, 1.0, (spec.n_vocab, H)),
         "output.weight": rng.normal(0, 0.3, (spec.n_vocab, H)),
         "output_norm.weight": 1 + rng.normal(0, 0.1, H)}
    for i in range(spec.n_layer):
        b = f"blk.{i}."
        w[b + "attn_norm.weight"] = 1 + rng.normal(0, 0.1, H)
        w[b + "attn_q.weight"] = rng.normal(0, H ** -0.5, (q, H))
        w[b + "attn_k.weight"] = rng.normal(0, H ** -0.5, (kv, H))
        w[b + "attn_v.weight"] = rng.normal(0, H ** -0.5, (kv, H))
        w[b + "attn_output.weight"] = rng.normal(0, q ** -0.5, (H, q))
        w[b + "attn_q_norm.weight"] = 1 + rng.normal(0, 0.1, spec.head_dim)
        w[b + "attn_k_norm.weight"] = 1 + rng.normal(0, 0.1, spec.head_dim)
        w[b + "ffn_norm.weight"] = 1 + rng.normal(0, 0.1, H)
        w[b + "ffn_gate.weight"] = rng.normal(0, H ** -0.5, (spec.n_ff, H))
        w[b + "ffn_up.weight"] = rng.normal(0, H ** -0.5, (spec.n_ff, H))
        w[b + "ffn_down.weight"] = rng.normal(0, spec.n_ff ** -0.5, (H, spec.n_ff))
    # bf16-exact values, so that a BF16 checkpoint holds exactly the target's embeddings/head
    return {k: bf16_round(v.astype(np.float32)) for k, v in w.items()}


def make_target_gguf(path: Path, spec: TargetSpec = TargetSpec(), arch: str = "qwen3",
                     extra_arrays: dict | None = None) -> Path:
    """A loadable qwen3-arch (or other arch name, for capability tests) target GGUF;
    `extra_arrays` adds integer array keys (e.g. an M-RoPE target's rope.dimension_sections)."""
    w = target_arrays(spec)
    tokens, types, merges = make_vocab(spec.n_vocab)
    writer = gguf.GGUFWriter(path, arch)
    for key, values in (extra_arrays or {}).items():
        writer.add_array(key, list(values))
    writer.add_name("synthetic target")
    a = arch
    writer.add_uint32(f"{a}.context_length", 4096)
    writer.add_uint32(f"{a}.embedding_length", spec.n_embd)
    writer.add_uint32(f"{a}.block_count", spec.n_layer)
    writer.add_uint32(f"{a}.feed_forward_length", spec.n_ff)
    writer.add_uint32(f"{a}.attention.head_count", spec.n_head)
    writer.add_uint32(f"{a}.attention.head_count_kv", spec.n_head_kv)
    writer.add_uint32(f"{a}.attention.key_length", spec.head_dim)
    writer.add_uint32(f"{a}.attention.value_length", spec.head_dim)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", spec.eps)
    writer.add_float32(f"{a}.rope.freq_base", spec.rope_theta)
    writer.add_uint32("general.file_type", 0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(spec.n_vocab - 4)
    writer.add_eos_token_id(spec.n_vocab - 2)
    writer.add_pad_token_id(spec.n_vocab - 4)
    writer.add_add_bos_token(False)
    writer.add_string("tokenizer.chat_template", "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                      "{{ m['content'] }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
    for name, arr in w.items():
        writer.add_tensor(name, arr.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


# --------------------------------------------------------------------------------------
# DeepSpec DFlash / DSpark checkpoints
# --------------------------------------------------------------------------------------


def dspark_config(spec: TargetSpec, *, backbone="qwen3", n_layer=2, markov_rank=32, conf=True,
                  block_size=4, target_layer_ids=(0, 1, 2)) -> dict:
    base = {
        "hidden_size": spec.n_embd, "intermediate_size": spec.n_ff, "num_hidden_layers": n_layer,
        "num_attention_heads": spec.n_head, "vocab_size": spec.n_vocab, "rms_norm_eps": spec.eps,
        "max_position_embeddings": 4096, "attention_bias": False, "tie_word_embeddings": False,
        "num_target_layers": spec.n_layer, "target_layer_ids": list(target_layer_ids),
        "block_size": block_size, "mask_token_id": spec.mask_id, "markov_rank": markov_rank,
        "enable_confidence_head": bool(conf), "num_anchors": 512,
        "layer_types": ["full_attention"] * n_layer, "dtype": "bfloat16",
    }
    if markov_rank:
        base["markov_head_type"] = "vanilla"
    if conf:
        base["confidence_head_with_markov"] = bool(markov_rank)
    if backbone == "qwen3":
        base.update({"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3",
                     "num_key_value_heads": spec.n_head_kv, "head_dim": spec.head_dim,
                     "hidden_act": "silu",
                     "rope_parameters": {"rope_theta": spec.rope_theta, "rope_type": "default"}})
    else:
        base.update({"architectures": ["Gemma4DSparkModel"], "model_type": "gemma4_text",
                     "head_dim": spec.head_dim // 2, "global_head_dim": spec.head_dim,
                     "num_key_value_heads": spec.n_head_kv, "num_global_key_value_heads": 1,
                     "attention_k_eq_v": True, "hidden_activation": "gelu_pytorch_tanh",
                     "enable_moe_block": False, "hidden_size_per_layer_input": 0,
                     "use_double_wide_mlp": False, "num_kv_shared_layers": 0,
                     "final_logit_softcapping": None,
                     "rope_parameters": {
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": spec.rope_theta},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                     "target_model_type": "gemma4", "target_text_model_type": "gemma4_text"})
    return base


def dspark_tensors(spec: TargetSpec, config: dict, seed: int = 1) -> dict:
    """DeepSpec state-dict keys (no `model.` prefix) for a config made by dspark_config."""
    rng = np.random.default_rng(seed)
    tw = target_arrays(spec)
    gemma = config["model_type"].startswith("gemma4")
    H, V, I = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    nH = config["num_attention_heads"]
    hd = config["global_head_dim"] if gemma else config["head_dim"]
    nKV = config["num_global_key_value_heads"] if gemma else config["num_key_value_heads"]
    K, R = len(config["target_layer_ids"]), config["markov_rank"]
    norm = lambda n: (1 + rng.normal(0, 0.1, n)).astype(np.float32)  # noqa: E731
    lin = lambda o, i: rng.normal(0, i ** -0.5, (o, i)).astype(np.float32)  # noqa: E731
    t = {"embed_tokens.weight": tw["token_embd.weight"], "lm_head.weight": tw["output.weight"],
         "fc.weight": lin(H, K * H), "hidden_norm.weight": norm(H), "norm.weight": norm(H)}
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        t[p + "input_layernorm.weight"] = norm(H)
        t[p + "self_attn.q_proj.weight"] = lin(nH * hd, H)
        t[p + "self_attn.k_proj.weight"] = lin(nKV * hd, H)
        if not gemma:
            t[p + "self_attn.v_proj.weight"] = lin(nKV * hd, H)
        t[p + "self_attn.o_proj.weight"] = lin(H, nH * hd)
        t[p + "self_attn.q_norm.weight"] = norm(hd)
        t[p + "self_attn.k_norm.weight"] = norm(hd)
        t[p + "post_attention_layernorm.weight"] = norm(H)
        if gemma:
            t[p + "pre_feedforward_layernorm.weight"] = norm(H)
            t[p + "post_feedforward_layernorm.weight"] = norm(H)
            t[p + "layer_scalar"] = np.array([0.5 + rng.random()], dtype=np.float32)
        t[p + "mlp.gate_proj.weight"] = lin(I, H)
        t[p + "mlp.up_proj.weight"] = lin(I, H)
        t[p + "mlp.down_proj.weight"] = lin(H, I)
    if R:
        t["markov_head.markov_w1.weight"] = rng.normal(0, 1.0, (V, R)).astype(np.float32)
        t["markov_head.markov_w2.weight"] = rng.normal(0, 0.5 * R ** -0.5, (V, R)).astype(np.float32)
    if config.get("enable_confidence_head"):
        width = H + R if R else H
        t["confidence_head.proj.weight"] = rng.normal(0, width ** -0.5, (1, width)).astype(np.float32)
        t["confidence_head.proj.bias"] = np.array([0.1], dtype=np.float32)
    return t


def make_dspark_checkpoint(directory: Path, spec: TargetSpec = TargetSpec(), *, dtype="BF16",
                           shards=1, seed=1, **config_kw) -> Path:
    config = dspark_config(spec, **config_kw)
    return write_checkpoint(directory, config, dspark_tensors(spec, config, seed), dtype, shards)


# --------------------------------------------------------------------------------------
# EAGLE-3 checkpoints
# --------------------------------------------------------------------------------------


def eagle3_config(spec: TargetSpec, *, hidden=64, n_head=4, n_kv=2, n_ff=128, draft_vocab=256,
                  layers=(1, 2, 3)) -> dict:
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
            "hidden_size": hidden, "intermediate_size": n_ff, "num_hidden_layers": 1,
            "num_attention_heads": n_head, "num_key_value_heads": n_kv, "head_dim": hidden // n_head,
            "vocab_size": spec.n_vocab, "draft_vocab_size": draft_vocab, "rms_norm_eps": spec.eps,
            "rope_theta": 10000.0, "max_position_embeddings": 2048, "hidden_act": "silu",
            "target_hidden_size": spec.n_embd, "eagle_aux_hidden_state_layer_ids": list(layers),
            "tie_word_embeddings": False}


def eagle3_tensors(spec: TargetSpec, config: dict, seed: int = 2) -> dict:
    rng = np.random.default_rng(seed)
    tw = target_arrays(spec)
    Hd, Ht, I = config["hidden_size"], config["target_hidden_size"], config["intermediate_size"]
    nH, nKV, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    Vd = config["draft_vocab_size"]
    norm = lambda n: (1 + rng.normal(0, 0.1, n)).astype(np.float32)  # noqa: E731
    lin = lambda o, i: rng.normal(0, i ** -0.5, (o, i)).astype(np.float32)  # noqa: E731
    # d2t offsets: draft token i -> target token i + d2t[i] (a sorted random subset)
    keep = np.sort(rng.choice(spec.n_vocab, Vd, replace=False))
    t = {"fc.weight": lin(Hd, 3 * Ht), "norm.weight": norm(Hd), "lm_head.weight": lin(Vd, Hd),
         "embed_tokens.weight": tw["token_embd.weight"][:, :Hd] if Hd <= spec.n_embd else lin(spec.n_vocab, Hd),
         "d2t": (keep - np.arange(Vd)).astype(np.int64),
         "midlayer.input_layernorm.weight": norm(Hd), "midlayer.hidden_norm.weight": norm(Hd),
         "midlayer.self_attn.q_proj.weight": lin(nH * hd, 2 * Hd),
         "midlayer.self_attn.k_proj.weight": lin(nKV * hd, 2 * Hd),
         "midlayer.self_attn.v_proj.weight": lin(nKV * hd, 2 * Hd),
         "midlayer.self_attn.o_proj.weight": lin(Hd, nH * hd),
         "midlayer.post_attention_layernorm.weight": norm(Hd),
         "midlayer.mlp.gate_proj.weight": lin(I, Hd), "midlayer.mlp.up_proj.weight": lin(I, Hd),
         "midlayer.mlp.down_proj.weight": lin(Hd, I)}
    return t


def make_eagle3_checkpoint(directory: Path, spec: TargetSpec = TargetSpec(), *, dtype="BF16", **kw) -> Path:
    config = eagle3_config(spec, **kw)
    tensors = eagle3_tensors(spec, config)
    tensors["t2d"] = np.zeros(1, dtype=np.int64)  # present in SpecForge exports; dropped
    return write_checkpoint(directory, config, tensors, dtype)


def deepspec_eagle3_config(spec: TargetSpec, *, backbone="qwen3", layers=(0, 1, 2, 3, 4), n_head=4, n_kv=2,
                           head_dim=16, n_ff=96, draft_vocab=None) -> dict:
    """Qwen3Eagle3Model's config (docs/gguf-formats.md §1, §4): a copy of the target's plus the
    Eagle3 keys; DeepSpec layer ids are layer *outputs* (the converter adds 1)."""
    arch = {"qwen3": "Qwen3Eagle3Model", "gemma4": "Gemma4Eagle3Model"}[backbone]
    cfg = {"architectures": [arch], "model_type": backbone, "hidden_size": spec.n_embd,
           "intermediate_size": n_ff, "num_hidden_layers": 1, "draft_num_hidden_layers": 1,
           "num_attention_heads": n_head, "num_key_value_heads": n_kv, "head_dim": head_dim,
           "vocab_size": spec.n_vocab, "rms_norm_eps": spec.eps, "rope_theta": spec.rope_theta,
           "max_position_embeddings": 4096, "attention_bias": False, "hidden_act": "silu",
           "num_target_layers": spec.n_layer, "target_layer_ids": list(layers),
           "layer_types": ["full_attention"], "ttt_length": 7, "step_loss_decay": 0.8,
           "tie_word_embeddings": False}
    if draft_vocab:
        cfg["draft_vocab_size"] = draft_vocab
    return cfg


def deepspec_eagle3_tensors(config: dict, embed: np.ndarray, head: np.ndarray, seed: int = 3) -> dict:
    """Random Qwen3Eagle3Model weights; embeddings/head are the target's (frozen copies).
    With draft_vocab_size set, the head keeps a random subset of rows and d2t holds offsets."""
    rng = np.random.default_rng(seed)
    H, I, K = config["hidden_size"], config["intermediate_size"], len(config["target_layer_ids"])
    nH, nKV, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    norm = lambda n: (1 + rng.normal(0, 0.2, n)).astype(np.float32)  # noqa: E731
    lin = lambda o, i: rng.normal(0, i ** -0.5, (o, i)).astype(np.float32)  # noqa: E731
    p = "layers.0."
    t = {"embed_tokens.weight": embed, "lm_head.weight": head, "fc.weight": lin(H, K * H),
         "norm.weight": norm(H), p + "input_layernorm.weight": norm(H), p + "hidden_norm.weight": norm(H),
         p + "self_attn.q_proj.weight": lin(nH * hd, 2 * H), p + "self_attn.k_proj.weight": lin(nKV * hd, 2 * H),
         p + "self_attn.v_proj.weight": lin(nKV * hd, 2 * H), p + "self_attn.o_proj.weight": lin(H, nH * hd),
         p + "self_attn.q_norm.weight": norm(hd), p + "self_attn.k_norm.weight": norm(hd),
         p + "post_attention_layernorm.weight": norm(H),
         p + "mlp.gate_proj.weight": lin(I, H), p + "mlp.up_proj.weight": lin(I, H),
         p + "mlp.down_proj.weight": lin(H, I)}
    Vd = config.get("draft_vocab_size")
    if Vd:
        keep = np.sort(rng.choice(len(head), Vd, replace=False))
        t["lm_head.weight"] = head[keep]
        t["d2t"] = (keep - np.arange(Vd)).astype(np.int64)
    return t


def make_deepspec_eagle3_checkpoint(directory: Path, spec: TargetSpec = TargetSpec(), *, dtype="BF16",
                                    seed=3, **config_kw) -> Path:
    """A DeepSpec Eagle3 (Qwen3Eagle3Model, or Gemma4Eagle3Model's config with backbone="gemma4"):
    5 target layers, q/k norms. The default ids need a target with at least 6 layers."""
    config = deepspec_eagle3_config(spec, **config_kw)
    tw = target_arrays(spec)
    tensors = deepspec_eagle3_tensors(config, tw["token_embd.weight"], tw["output.weight"], seed)
    return write_checkpoint(directory, config, tensors, dtype)


# --------------------------------------------------------------------------------------
# Gemma-4 DFlash / DSpark checkpoints for a synthetic gemma4 target (specgguf.synthetic.gemma4)
# --------------------------------------------------------------------------------------


def gemma4_target_spec(target_path) -> tuple[TargetSpec, dict, list]:
    """(TargetSpec, {token_embd, output}, token types) read back from a gemma4 target GGUF."""
    r = gguf.GGUFReader(target_path)
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("GGUF.")}
    t = {x.name: np.array(x.data, dtype=np.float32) for x in r.tensors
         if x.name in ("token_embd.weight", "output.weight")}
    t.setdefault("output.weight", t["token_embd.weight"])  # tied
    spec = TargetSpec(n_vocab=len(f["tokenizer.ggml.tokens"]), n_embd=f["gemma4.embedding_length"],
                      n_layer=f["gemma4.block_count"], n_head=f["gemma4.attention.head_count"],
                      head_dim=f["gemma4.attention.key_length"], n_ff=f["gemma4.feed_forward_length"],
                      rope_theta=f["gemma4.rope.freq_base"])
    return spec, t, f["tokenizer.ggml.token_type"]


def make_gemma4_dspark_checkpoint(directory: Path, target_path, *, dtype="BF16", seed=1, counting=False,
                                  softcap=None, **config_kw) -> Path:
    """A Gemma4DSparkModel checkpoint whose embeddings and head are the target's (frozen copies,
    as DeepSpec trains them) and whose mask is Gemma's `<mask>` (id 4). counting=True: the Markov
    head encodes the counting target's successor rule (specgguf.synthetic.gemma4) and outweighs
    the draft's own logits, so whole blocks are accepted where the target counts."""
    from specgguf.synthetic.qwen3 import head_for
    from specgguf.synthetic.gemma4 import MASK_ID, gemma_successor

    spec, tw, types = gemma4_target_spec(target_path)
    config = dspark_config(spec, backbone="gemma4", **config_kw)
    config.update({"mask_token_id": MASK_ID, "final_logit_softcapping": softcap,
                   "dtype": {"BF16": "bfloat16", "F16": "float16"}.get(dtype, "float32")})
    tensors = dspark_tensors(spec, config, seed)
    tensors["embed_tokens.weight"], tensors["lm_head.weight"] = tw["token_embd.weight"], tw["output.weight"]
    if counting:
        w1 = tensors["markov_head.markov_w1.weight"]
        tensors["markov_head.markov_w2.weight"] = head_for(w1, gemma_successor(types), 40.0)
    return write_checkpoint(directory, config, tensors, dtype)


def gemma4_eagle3_config(spec: TargetSpec, *, layers=(0, 1, 2, 3, 4), n_ff=96, softcap=None,
                         dtype="bfloat16") -> dict:
    """Gemma4Eagle3Model's config: the gemma4 target's text config (global heads: `global_head_dim`,
    `num_global_key_value_heads` = 1, K = V, proportional RoPE) plus the Eagle3 keys."""
    return {"architectures": ["Gemma4Eagle3Model"], "model_type": "gemma4_text",
            "hidden_size": spec.n_embd, "intermediate_size": n_ff, "num_hidden_layers": 1,
            "draft_num_hidden_layers": 1, "num_attention_heads": spec.n_head,
            "num_key_value_heads": spec.n_head_kv, "head_dim": spec.head_dim // 2,
            "global_head_dim": spec.head_dim, "num_global_key_value_heads": 1, "attention_k_eq_v": True,
            "hidden_activation": "gelu_pytorch_tanh", "enable_moe_block": False,
            "hidden_size_per_layer_input": 0, "vocab_size": spec.n_vocab, "rms_norm_eps": spec.eps,
            "rope_parameters": {
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": spec.rope_theta},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
            "max_position_embeddings": 4096, "attention_bias": False, "final_logit_softcapping": softcap,
            "num_target_layers": spec.n_layer, "target_layer_ids": list(layers),
            "layer_types": ["full_attention"], "ttt_length": 7, "step_loss_decay": 0.8,
            "tie_word_embeddings": False, "dtype": dtype,
            "target_model_type": "gemma4", "target_text_model_type": "gemma4_text"}


def gemma4_eagle3_tensors(config: dict, embed: np.ndarray, head: np.ndarray, seed: int = 4) -> dict:
    """Random Gemma4Eagle3Model weights (no v_proj: K = V; a layer_scalar buffer)."""
    rng = np.random.default_rng(seed)
    H, I, K = config["hidden_size"], config["intermediate_size"], len(config["target_layer_ids"])
    nH, nKV, hd = config["num_attention_heads"], config["num_global_key_value_heads"], config["global_head_dim"]
    norm = lambda n: (1 + rng.normal(0, 0.2, n)).astype(np.float32)  # noqa: E731
    lin = lambda o, i: rng.normal(0, i ** -0.5, (o, i)).astype(np.float32)  # noqa: E731
    p = "layers.0."
    return {"embed_tokens.weight": embed, "lm_head.weight": head, "fc.weight": lin(H, K * H),
            "norm.weight": norm(H), p + "input_layernorm.weight": norm(H), p + "hidden_norm.weight": norm(H),
            p + "self_attn.q_proj.weight": lin(nH * hd, 2 * H), p + "self_attn.k_proj.weight": lin(nKV * hd, 2 * H),
            p + "self_attn.o_proj.weight": lin(H, nH * hd),
            p + "self_attn.q_norm.weight": norm(hd), p + "self_attn.k_norm.weight": norm(hd),
            p + "post_attention_layernorm.weight": norm(H), p + "pre_feedforward_layernorm.weight": norm(H),
            p + "post_feedforward_layernorm.weight": norm(H),
            p + "layer_scalar": np.array([0.5 + rng.random()], dtype=np.float32),
            p + "mlp.gate_proj.weight": lin(I, H), p + "mlp.up_proj.weight": lin(I, H),
            p + "mlp.down_proj.weight": lin(H, I)}


def make_gemma4_eagle3_checkpoint(directory: Path, target_path, *, dtype="BF16", seed=4, softcap=None,
                                  head=None, **config_kw) -> Path:
    """A Gemma4Eagle3Model checkpoint for a gemma4 target GGUF (specgguf.synthetic.gemma4): its
    embeddings and head are the target's (frozen copies), unless `head` ([V, H]) replaces the head."""
    spec, tw, _ = gemma4_target_spec(target_path)
    config = gemma4_eagle3_config(spec, softcap=softcap, **config_kw,
                                  dtype={"BF16": "bfloat16", "F16": "float16"}.get(dtype, "float32"))
    tensors = gemma4_eagle3_tensors(config, tw["token_embd.weight"],
                                    tw["output.weight"] if head is None else head, seed)
    return write_checkpoint(directory, config, tensors, dtype)


# --------------------------------------------------------------------------------------
# Community DFlash / DSpark / DFlash 2 layouts (converters/community.py, docs/gguf-formats.md §8)
# --------------------------------------------------------------------------------------

COMMUNITY_LAYOUTS = ("specforge", "speculators", "lfm2", "ling", "zlab", "dflash2")


def qwen3_target_spec(target_path) -> TargetSpec:
    """The TargetSpec of a synthetic qwen3 target GGUF (specgguf.synthetic.write_qwen3)."""
    r = gguf.GGUFReader(target_path)
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("GGUF.")}
    spec = TargetSpec(n_vocab=len(f["tokenizer.ggml.tokens"]), n_embd=f["qwen3.embedding_length"],
                      n_layer=f["qwen3.block_count"], n_head=f["qwen3.attention.head_count"],
                      n_head_kv=f["qwen3.attention.head_count_kv"], head_dim=f["qwen3.attention.key_length"],
                      n_ff=f["qwen3.feed_forward_length"], rope_theta=f["qwen3.rope.freq_base"])
    assert f["tokenizer.ggml.tokens"][spec.mask_id] == "<|mask|>"
    return spec


def to_interleaved(w: np.ndarray, head_dim: int) -> np.ndarray:
    """NeoX (rotate-half) rows -> interleaved RoPE pairs, per head: what an interleaved-RoPE
    export (rope_is_neox_style false) stores for the same model."""
    shape = w.shape
    return np.ascontiguousarray(w.reshape(-1, 2, head_dim // 2, *shape[1:]).swapaxes(1, 2).reshape(shape))


def _backbone_config(cfg: dict) -> dict:
    keys = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "max_position_embeddings",
            "attention_bias", "hidden_act", "rope_parameters", "layer_types", "tie_word_embeddings")
    return {k: cfg[k] for k in keys if k in cfg}


def community_layout(layout: str, cfg: dict, tensors: dict, *, draft_vocab: int | None = None,
                     sample_from_anchor: bool | None = None, seed: int = 5,
                     conv=(2, 16), selector=(8, 4)) -> tuple[dict, dict]:
    """(config, tensors) of `layout` for the DeepSpec qwen3 draft (cfg, tensors) from
    dspark_config/dspark_tensors: the same model, as that exporter saves it."""
    cfg, t = json.loads(json.dumps(cfg)), dict(tensors)
    method = {"target_layer_ids": cfg["target_layer_ids"], "mask_token_id": cfg["mask_token_id"]}
    rank = cfg.get("markov_rank") or 0
    heads = {k: cfg.pop(k) for k in ("markov_rank", "markov_head_type", "enable_confidence_head",
                                      "confidence_head_with_markov") if k in cfg}
    if layout == "ling":  # DeepSpec's own Ling drafts: another class name, same everything
        cfg.update(heads, architectures=["LingDSparkModel"])
    elif layout == "specforge":  # SpecForge: keys nested in dflash_config, no embeddings or head
        for k in ("target_layer_ids", "mask_token_id"):
            cfg.pop(k)
        cfg.update(architectures=["DSparkDraftModel"], auto_map={"AutoModel": "dspark.DSparkDraftModel"},
                   markov_rank=rank, dflash_config={**method, **heads, "projector_type": "dspark",
                                                    "attention_mode": "gqa"})
        del t["embed_tokens.weight"], t["lm_head.weight"]
    elif layout == "lfm2":  # LiquidAI: interleaved RoPE rows, keys in dflash_config, no tables
        hd = cfg["head_dim"]
        for k in ("target_layer_ids", "mask_token_id", "num_target_layers"):
            method[k] = cfg.pop(k)
        cfg.update(heads, architectures=["Lfm2DSparkDraftModel"], rope_is_neox_style=False,
                   rope_theta=cfg["rope_parameters"]["rope_theta"], dflash_config=method)
        del cfg["rope_parameters"]
        for n in list(t):
            if n.endswith(("q_proj.weight", "k_proj.weight", "q_norm.weight", "k_norm.weight")):
                t[n] = to_interleaved(t[n], hd)
        del t["embed_tokens.weight"], t["lm_head.weight"]
    elif layout == "speculators":  # vLLM speculators: nested backbone config, layer-input ids
        V = cfg["vocab_size"]
        Vd = draft_vocab or V
        cfg = {"architectures": ["DSparkSpeculator"], "speculators_model_type": "dspark",
               "transformer_layer_config": _backbone_config(cfg), "draft_vocab_size": Vd,
               "block_size": cfg["block_size"], "num_anchors": 512,
               "aux_hidden_state_layer_ids": [i + 1 for i in cfg["target_layer_ids"]],
               "mask_token_id": cfg["mask_token_id"], "markov_rank": rank, "markov_head_type": "vanilla",
               "enable_confidence_head": "confidence_head.proj.weight" in t,
               "confidence_head_with_markov": True, "sliding_window_non_causal": False,
               "speculators_config": {"algorithm": "dspark", "default_proposal_method": "greedy",
                                      "proposal_methods": [{"proposal_type": "greedy",
                                                            "speculative_tokens": cfg["block_size"]}]}}
        del t["embed_tokens.weight"]  # left out on save; lm_head (the target's rows) is kept
        if Vd < V:
            rng = np.random.default_rng(seed)
            keep = np.sort(rng.choice(V, Vd, replace=False))
            t["lm_head.weight"] = t["lm_head.weight"][keep]
            if rank:
                t["markov_head.markov_w2.weight"] = t["markov_head.markov_w2.weight"][keep]
            t["d2t"] = (keep - np.arange(Vd)).astype(np.int64)
            mask = np.zeros(V, dtype=np.bool_)
            mask[keep] = True
            t["t2d"] = mask
    elif layout in ("zlab", "dflash2"):  # z-lab: keys in dflash_config, in-place slots, no tables
        for n in [n for n in t if n.startswith(("markov_head.", "confidence_head."))]:
            del t[n]
        del t["embed_tokens.weight"], t["lm_head.weight"]
        cfg.update(architectures=["DFlashDraftModel"], dflash_config=method)
        for k in ("target_layer_ids", "mask_token_id", "num_anchors"):
            cfg.pop(k)
        if layout == "dflash2":
            rng = np.random.default_rng(seed)
            H, V = cfg["hidden_size"], cfg["vocab_size"]
            (kernel, group), (sel_rank, top_k) = conv, selector
            method.update(conv_kernel_size=kernel, conv_group_size=group, selector_rank=sel_rank,
                          selector_top_k=top_k)
            cfg["architectures"] = ["DFlash2DraftModel"]
            for i in range(cfg["num_hidden_layers"]):
                for m in ("attention_conv", "mlp_conv"):
                    base = np.zeros((2, kernel, H), dtype=np.float32)
                    base[:, 0] = 1.0  # identity, as trained ones start
                    base += rng.normal(0, 0.1, base.shape).astype(np.float32)
                    t[f"layers.{i}.{m}.base_kernel"] = base
                    t[f"layers.{i}.{m}.kernel_projection.weight"] = \
                        rng.normal(0, 0.02, (2 * kernel * (H // group), H)).astype(np.float32)
            t["candidate_selector.predecessor_codebook"] = rng.normal(0, 0.5, (V, sel_rank)).astype(np.float32)
            t["candidate_selector.successor_codebook"] = rng.normal(0, 0.5, (V, sel_rank)).astype(np.float32)
            t["candidate_selector.hidden_projection.weight"] = \
                rng.normal(0, H ** -0.5, (sel_rank, H)).astype(np.float32)
    else:
        raise ValueError(layout)
    if sample_from_anchor is not None:
        cfg["sample_from_anchor"] = sample_from_anchor
    return cfg, t


def make_community_checkpoint(directory: Path, spec: TargetSpec, layout: str, *, dtype="BF16", seed=1,
                              draft_vocab=None, sample_from_anchor=None, edit=None, **config_kw) -> Path:
    """A checkpoint of a community layout whose weights are make_dspark_checkpoint's (same seed).
    `edit(config, tensors)` changes either before writing."""
    base = dspark_config(spec, **config_kw)
    cfg, t = community_layout(layout, base, dspark_tensors(spec, base, seed), draft_vocab=draft_vocab,
                              sample_from_anchor=sample_from_anchor)
    if edit is not None:
        edit(cfg, t)
    return write_checkpoint(directory, cfg, t, dtype)


def write_torch_pt(path: Path, obj: dict) -> Path:
    """A torch.save (zip) archive of a flat dict of ints and float32 arrays, written by hand:
    the pickle rebuilds each array with torch._utils._rebuild_tensor_v2 from a FloatStorage,
    as torch's own files do. The converter reads it without torch (converters/torchpt.py)."""
    import zipfile

    def uni(text: str) -> bytes:
        raw = text.encode()
        return b"X" + struct.pack("<I", len(raw)) + raw

    def binint(v: int) -> bytes:
        return b"J" + struct.pack("<i", int(v))

    def tup(items) -> bytes:
        return b"(" + b"".join(items) + b"t"

    body, storages = [b"\x80\x02}("], {}
    for key, value in obj.items():
        body.append(uni(key))
        if isinstance(value, np.ndarray):
            arr = np.ascontiguousarray(value, dtype=np.float32)
            skey = str(len(storages))
            storages[skey] = arr.astype("<f4").tobytes()
            strides = [int(np.prod(arr.shape[i + 1:], dtype=np.int64)) for i in range(arr.ndim)]
            pid = tup([uni("storage"), b"ctorch\nFloatStorage\n", uni(skey), uni("cpu"), binint(arr.size)])
            args = tup([pid + b"Q", binint(0), tup(binint(d) for d in arr.shape),
                        tup(binint(s) for s in strides), b"\x89", b"ccollections\nOrderedDict\n)R"])
            body.append(b"ctorch._utils\n_rebuild_tensor_v2\n" + args + b"R")
        else:
            body.append(binint(value))
    body.append(b"u.")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"".join(body))
        z.writestr("archive/byteorder", "little")
        for skey, raw in storages.items():
            z.writestr(f"archive/data/{skey}", raw)
        z.writestr("archive/version", "3\n")
    return Path(path)
