#!/usr/bin/python3
"""Fixtures for tests/convert, written without torch: safetensors is an 8-byte little-endian
header length, a JSON header {name: {dtype, shape, data_offsets}}, then the raw bytes.

    make_fixtures.py OUT_DIR

OUT_DIR/llama_bf16/          LlamaForCausalLM, untied, BF16, config fields real files carry
OUT_DIR/mistral_f16/         MistralForCausalLM, tied, F16, sliding_window null
OUT_DIR/llama_f32_sharded/   F32 in 3 shards + model.safetensors.index.json
OUT_DIR/qwen2_bf16/          Qwen2ForCausalLM, tied, BF16, q/k/v biases, the fields Qwen2.5's config.json
                             carries (use_sliding_window false with a sliding_window, max_window_layers, ...)
OUT_DIR/llama_bytes/         LlamaForCausalLM, BF16, the byte vocabulary (259 tokens, EOS 257): generate --prompt
OUT_DIR/bad_dirs/<case>/     HF dirs with a missing / unexpected / misshapen tensor, bad index
OUT_DIR/bad_files/<case>.safetensors  damaged single files (see DAMAGED below)
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

DIMS = dict(vocab=320, hidden=32, inter=48, layers=2, heads=4, kv=2)


def param_shapes(tied, qkv_bias=False):
    d, C = DIMS, DIMS["hidden"]
    hd = C // d["heads"]
    out = [("model.embed_tokens.weight", (d["vocab"], C))]
    for l in range(d["layers"]):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (C,))]
        for proj, rows in (("q", d["heads"] * hd), ("k", d["kv"] * hd), ("v", d["kv"] * hd)):
            out += [(p + f"self_attn.{proj}_proj.weight", (rows, C))]
            out += [(p + f"self_attn.{proj}_proj.bias", (rows,))] if qkv_bias else []
        out += [(p + "self_attn.o_proj.weight", (C, d["heads"] * hd)), (p + "post_attention_layernorm.weight", (C,)),
                (p + "mlp.gate_proj.weight", (d["inter"], C)), (p + "mlp.up_proj.weight", (d["inter"], C)),
                (p + "mlp.down_proj.weight", (C, d["inter"]))]
    out.append(("model.norm.weight", (C,)))
    if not tied:
        out.append(("lm_head.weight", (d["vocab"], C)))
    return out


def raw(arr, dtype):
    """Little-endian bytes of float32 `arr` in `dtype`; bf16 keeps the top half of each float32."""
    a = np.asarray(arr, dtype="<f4")
    if dtype == "F32":
        return a.tobytes()
    if dtype == "F16":
        return a.astype("<f2").tobytes()
    return (a.view("<u4") >> 16).astype("<u2").tobytes()


def write_st(path, tensors, pad=True, metadata={"format": "pt"}):
    """tensors: list of (name, dtype, shape, bytes), written in that order."""
    header, off, blobs = {}, 0, []
    for name, dt, shape, b in tensors:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def model_tensors(dtype, tied, seed, qkv_bias=False):
    rng = np.random.default_rng(seed)
    out = []
    for name, shape in param_shapes(tied, qkv_bias):
        if "norm" in name:
            v = 1.0 + 0.2 * rng.standard_normal(shape)
        else:
            v = 0.2 * rng.standard_normal(shape)
        v = v.astype(np.float32)
        if dtype == "F32":
            v.flat[:3] = [1e-40, -0.0, 3.4e38]  # a subnormal, a negative zero, a large value: bits must survive
        out.append((name, dtype, shape, raw(v, dtype)))
    return out


# What Qwen2.5-0.5B's config.json carries beyond the shapes (the shapes here stay tiny).
QWEN25_FIELDS = dict(bos_token_id=151643, eos_token_id=151643, max_window_layers=24, sliding_window=32768,
                     use_sliding_window=False, use_mrope=False, rope_theta=1000000.0, max_position_embeddings=32768,
                     transformers_version="4.40.1", torch_dtype="bfloat16")


def config(arch, tied, **extra):
    d = DIMS
    c = {"architectures": [arch],
         "model_type": {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}[arch],
         "vocab_size": d["vocab"], "hidden_size": d["hidden"], "intermediate_size": d["inter"],
         "num_hidden_layers": d["layers"], "num_attention_heads": d["heads"], "num_key_value_heads": d["kv"],
         "hidden_act": "silu", "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 50000.0,
         "tie_word_embeddings": tied, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
         "initializer_range": 0.02, "use_cache": True, "attention_dropout": 0.0, "transformers_version": "4.45.0"}
    c.update(extra)
    return c


def model_dir(path, arch, dtype, tied, seed, shards=1, **extra):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config(arch, tied, **extra), f, indent=2)
    ts = model_tensors(dtype, tied, seed, arch == "Qwen2ForCausalLM")
    if shards == 1:
        write_st(os.path.join(path, "model.safetensors"), ts)
        return ts
    per = (len(ts) + shards - 1) // shards
    wmap = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = ts[i * per:(i + 1) * per]
        write_st(os.path.join(path, name), part)
        wmap.update({t[0]: name for t in part})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(len(t[3]) for t in ts)}, "weight_map": wmap}, f)
    return ts


def damaged(out):
    a = ("a", "F32", (2, 3), raw(np.arange(6), "F32"))
    b = ("b", "BF16", (4,), raw(np.ones(4), "BF16"))
    good = os.path.join(out, "good.safetensors")
    write_st(good, [a, b])
    data = open(good, "rb").read()
    cases = {
        "short": data[:5],
        "truncated": data[:-3],
        "header_past_end": struct.pack("<Q", 1 << 20) + data[8:],
        "bad_json": None,
        "overlap": None,
        "out_of_range": None,
        "size_mismatch": None,
        "unknown_dtype": None,
        "not_object": None,
    }

    def hdr(h, payload=data[len(data) - 32:]):
        j = json.dumps(h).encode()
        return struct.pack("<Q", len(j)) + j + payload

    cases["bad_json"] = struct.pack("<Q", 9) + b"{not json" + b"\0" * 8
    cases["overlap"] = hdr({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                            "b": {"dtype": "BF16", "shape": [4], "data_offsets": [20, 28]}})
    cases["out_of_range"] = hdr({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                                 "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 40]}})
    cases["size_mismatch"] = hdr({"a": {"dtype": "F32", "shape": [2, 4], "data_offsets": [0, 24]},
                                  "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]}})
    cases["unknown_dtype"] = hdr({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                                  "b": {"dtype": "F64", "shape": [1], "data_offsets": [24, 32]}})
    cases["not_object"] = hdr({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, "b": [1, 2]})
    os.makedirs(os.path.join(out, "bad_files"), exist_ok=True)
    for name, blob in cases.items():
        with open(os.path.join(out, "bad_files", name + ".safetensors"), "wb") as f:
            f.write(blob)


def bad_dirs(out):
    base = os.path.join(out, "bad_dirs")
    cases = {}
    for case in ["missing", "unexpected", "shape", "index_missing", "index_unlisted", "rope_scaling", "damaged",
                 "attention_bias", "mlp_bias"]:
        d = os.path.join(base, case)
        extra = {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}} if case == "rope_scaling" else {}
        extra = {case: True} if case.endswith("_bias") else extra
        ts = model_dir(d, "LlamaForCausalLM", "BF16", False, 7, shards=2 if case.startswith("index") else 1, **extra)
        cases[case] = (d, ts)
    # Qwen2 with an o_proj bias tensor (Qwen2 has none) and with a sliding window in use
    for case, extra in [("qwen2_o_bias", {}), ("qwen2_sliding", {"use_sliding_window": True, "sliding_window": 64})]:
        d = os.path.join(base, case)
        ts = model_dir(d, "Qwen2ForCausalLM", "BF16", True, 8, **{**QWEN25_FIELDS, **extra})
        cases[case] = (d, ts)
    d, ts = cases["qwen2_o_bias"]
    write_st(os.path.join(d, "model.safetensors"),
             ts + [("model.layers.1.self_attn.o_proj.bias", "BF16", (32,), raw(np.zeros(32), "BF16"))])
    d, ts = cases["missing"]
    write_st(os.path.join(d, "model.safetensors"), [t for t in ts if t[0] != "model.layers.1.mlp.up_proj.weight"])
    d, ts = cases["unexpected"]
    write_st(os.path.join(d, "model.safetensors"),
             ts + [("model.layers.0.self_attn.q_proj.bias", "BF16", (32,), raw(np.zeros(32), "BF16"))])
    d, ts = cases["shape"]
    ts = [(n, dt, (s[1], s[0]) if n == "model.layers.0.self_attn.k_proj.weight" else s, b) for n, dt, s, b in ts]
    write_st(os.path.join(d, "model.safetensors"), ts)
    d, ts = cases["index_missing"]  # the index names a tensor its shard lacks
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    idx["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors"
    json.dump(idx, open(os.path.join(d, "model.safetensors.index.json"), "w"))
    d, ts = cases["index_unlisted"]  # a shard holds a tensor the index does not list
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    del idx["weight_map"]["model.norm.weight"]
    json.dump(idx, open(os.path.join(d, "model.safetensors.index.json"), "w"))
    d, ts = cases["damaged"]
    p = os.path.join(d, "model.safetensors")
    blob = open(p, "rb").read()
    open(p, "wb").write(blob[:-100])


def main():
    out = sys.argv[1]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    model_dir(os.path.join(out, "llama_bf16"), "LlamaForCausalLM", "BF16", False, 1,
              pretraining_tp=1, mlp_bias=False, attention_bias=False, rope_scaling=None, head_dim=8)
    model_dir(os.path.join(out, "mistral_f16"), "MistralForCausalLM", "F16", True, 2, sliding_window=None,
              rope_theta=10000.0)
    model_dir(os.path.join(out, "llama_f32_sharded"), "LlamaForCausalLM", "F32", False, 3, shards=3)
    model_dir(os.path.join(out, "qwen2_bf16"), "Qwen2ForCausalLM", "BF16", True, 4, **QWEN25_FIELDS)
    DIMS["vocab"] = 259  # the byte tokenizer's (src/data/tokenizer.hpp), so --prompt TEXT needs no tokenizer
    model_dir(os.path.join(out, "llama_bytes"), "LlamaForCausalLM", "BF16", False, 5, bos_token_id=256, eos_token_id=257)
    DIMS["vocab"] = 320
    damaged(out)
    bad_dirs(out)


if __name__ == "__main__":
    main()
