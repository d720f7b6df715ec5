"""Peak RSS and time of converting a Qwen3-4B-sized DeepSpec DSpark checkpoint.

Makes, on the fly, a random-weight BF16 checkpoint with the shapes of DeepSpec's
dspark_qwen3_4b_block7 (H 2560, 5 draft layers, 32/8 heads of 128, FFN 9728, vocab 151936,
5 target layers, Markov rank 256, confidence head) and a metadata-only Qwen3-4B target GGUF
(36 layers, a 151936-token tokenizer), then converts it in a child process per setting and
reports that child's peak RSS (ru_maxrss) and wall time. Prints a table and writes JSON.

    python scripts/measure_convert_memory.py --workdir /somewhere/with/8GB [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

H, N, NH, NKV, HD, FF, V, K, R, BLOCK, NT = 2560, 5, 32, 8, 128, 9728, 151936, 5, 256, 7, 36


def shapes() -> dict:
    s = {"embed_tokens.weight": (V, H), "lm_head.weight": (V, H), "fc.weight": (H, K * H),
         "hidden_norm.weight": (H,), "norm.weight": (H,),
         "markov_head.markov_w1.weight": (V, R), "markov_head.markov_w2.weight": (V, R),
         "confidence_head.proj.weight": (1, H + R), "confidence_head.proj.bias": (1,)}
    for i in range(N):
        p = f"layers.{i}."
        s.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                  p + "self_attn.q_proj.weight": (NH * HD, H), p + "self_attn.k_proj.weight": (NKV * HD, H),
                  p + "self_attn.v_proj.weight": (NKV * HD, H), p + "self_attn.o_proj.weight": (H, NH * HD),
                  p + "self_attn.q_norm.weight": (HD,), p + "self_attn.k_norm.weight": (HD,),
                  p + "mlp.gate_proj.weight": (FF, H), p + "mlp.up_proj.weight": (FF, H),
                  p + "mlp.down_proj.weight": (H, FF)})
    return s


def write_checkpoint(d: Path) -> int:
    """Random BF16 values in [-0.06, 0.06] (norms near 1), streamed to model.safetensors."""
    d.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "hidden_size": H,
              "intermediate_size": FF, "num_hidden_layers": N, "num_attention_heads": NH,
              "num_key_value_heads": NKV, "head_dim": HD, "vocab_size": V, "rms_norm_eps": 1e-6,
              "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
              "max_position_embeddings": 40960, "attention_bias": False, "hidden_act": "silu",
              "tie_word_embeddings": False, "num_target_layers": NT, "target_layer_ids": [1, 9, 17, 25, 33],
              "block_size": BLOCK, "mask_token_id": 151669, "markov_rank": R, "markov_head_type": "vanilla",
              "enable_confidence_head": True, "confidence_head_with_markov": True, "num_anchors": 512,
              "layer_types": ["full_attention"] * N, "dtype": "bfloat16"}
    (d / "config.json").write_text(json.dumps(config))
    header, off = {}, 0
    for name, shape in shapes().items():
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    rng = np.random.default_rng(0)
    with open(d / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for name, shape in shapes().items():
            count = int(np.prod(shape))
            for start in range(0, count, 1 << 24):
                m = min(1 << 24, count - start)
                if len(shape) == 1:
                    bits = np.full(m, 0x3F80, np.uint16)  # 1.0
                else:  # exponent 2^-5..2^-4 with random mantissa and sign
                    bits = rng.integers(0x3D00, 0x3D80, m, dtype=np.uint16) | (rng.integers(0, 2, m, dtype=np.uint16) << 15)
                fh.write(bits.tobytes())
    return off


def write_target(path: Path) -> None:
    """A Qwen3-4B-shaped target GGUF: metadata and a full-size tokenizer, no weights needed."""
    import gguf

    w = gguf.GGUFWriter(path, "qwen3")
    for key, val in (("context_length", 40960), ("embedding_length", H), ("block_count", NT),
                     ("feed_forward_length", FF), ("attention.head_count", NH),
                     ("attention.head_count_kv", NKV), ("attention.key_length", HD),
                     ("attention.value_length", HD)):
        w.add_uint32(f"qwen3.{key}", val)
    w.add_float32("qwen3.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([f"tok{i}" for i in range(V)])
    w.add_token_types([1] * V)
    w.add_token_merges([f"t ok{i}" for i in range(151387)])
    w.add_eos_token_id(151645)
    # one small tensor so that the file has a tensor section; sizes for the cost estimate
    w.add_tensor("output_norm.weight", np.ones(H, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


CHILD = """
import sys, time
t = time.perf_counter()
from specgguf.converters import convert
r = convert(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
print(time.perf_counter() - t, r.size_bytes, r.tensors)
"""


def measure(ckpt: Path, target: Path, out: Path, out_type: str, head: str) -> dict:
    t0 = time.perf_counter()
    with open(out.with_suffix(".log"), "w+") as log:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(ckpt), str(target), str(out), out_type, head],
                                stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS (KiB on Linux)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        log.seek(0)
        text = log.read()
    out.with_suffix(".log").unlink()
    if proc.returncode != 0:
        raise SystemExit(f"conversion failed: {text.strip().splitlines()[-1]}")
    convert_s, size, n = text.split()[-3:]
    out.unlink()
    return {"type": out_type, "head": head, "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "wall_s": round(wall, 1), "convert_s": round(float(convert_s), 1),
            "output_mib": round(int(size) / 2 ** 20, 1), "tensors": int(n)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", required=True, type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--settings", default="q8_0:shared,f16:own,bf16:own,q4_k_m:shared")
    args = ap.parse_args()
    wd = args.workdir
    ckpt, target = wd / "dspark_qwen3_4b_synthetic", wd / "qwen3-4b-target.gguf"
    if not (ckpt / "model.safetensors").exists():
        t = time.perf_counter()
        nbytes = write_checkpoint(ckpt)
        print(f"made a {nbytes / 2**30:.2f} GiB BF16 checkpoint in {time.perf_counter() - t:.0f} s")
    if not target.exists():
        write_target(target)
    largest = max(int(np.prod(s)) * 2 for s in shapes().values())
    print(f"largest tensor: {largest / 2**20:.0f} MiB (BF16)")
    rows = []
    for setting in args.settings.split(","):
        out_type, head = setting.split(":")
        rows.append(measure(ckpt, target, wd / f"draft-{out_type}-{head}.gguf", out_type, head))
        r = rows[-1]
        print(f"{r['type']:>7} {r['head']:>6}  peak RSS {r['peak_rss_mib']:>7.1f} MiB  "
              f"convert {r['convert_s']:>6.1f} s  output {r['output_mib']:>7.1f} MiB", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"largest_tensor_mib": largest / 2 ** 20, "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
