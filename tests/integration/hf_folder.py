#!/usr/bin/env python3
"""Hugging Face folders written outside cleave, for hf_import_outside_test.sh.

  hf_folder.py write KIND OUT_DIR [--dtype bf16|f16|f32] [--shards N]
      a tiny model of KIND (gpt2, llama_gqa, llama_gqa_tied, mixtral) with random weights: its
      config.json as transformers writes one (extra keys included), and its tensors in N
      safetensors shards with model.safetensors.index.json (N = 1: one model.safetensors). The
      gpt2 folder is laid out as OpenAI's is: names without "transformer." and the attention's
      causal-mask buffers (attn.bias) beside the parameters.
  hf_folder.py compare HF_DIR EXPORTED_DIR
      every parameter of HF_DIR, widened to float32, against EXPORTED_DIR/model.safetensors (what
      `cleave export` wrote of the imported checkpoint): the same names, shapes and bits.
  hf_folder.py check-import CHECKPOINT_DIR
      the imported checkpoint's AdamW moments are zero and its step 0.
  hf_folder.py edit FILE drop|add|transpose|f64 NAME
      damages one safetensors file: drops tensor NAME, adds one, transposes it, or stores it F64.
  hf_folder.py index DIR NAME FILE
      model.safetensors.index.json of DIR lists tensor NAME in FILE.
  hf_folder.py same-params CHECKPOINT_A CHECKPOINT_B
      two cleave checkpoints written by one rank hold bitwise the same parameters and router
      biases.

safetensors by hand (Debian has no python3-safetensors): an 8-byte little-endian header length,
the JSON header, the bytes.
"""
import json
import os
import struct
import sys

import numpy as np

V, D, LAYERS, HEADS, POSITIONS = 256, 64, 2, 4, 64


def to_bf16_bits(a):
    """float32 -> bfloat16 bits, rounded to nearest even (as torch does)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def widen(raw, dtype):
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


def encode(a, dtype):
    """(dtype name, bytes) of a float32 array stored as dtype."""
    if dtype == "bf16":
        return "BF16", to_bf16_bits(a).tobytes()
    if dtype == "f16":
        return "F16", a.astype("<f2").tobytes()
    return "F32", a.astype("<f4").tobytes()


def write_safetensors(path, tensors):
    """tensors: [(name, dtype name, shape, bytes)]."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, _, data in tensors:
            f.write(data)


def read_raw(path):
    """[(name, dtype name, shape, bytes)] of a safetensors file, in its data order."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = [(name, i["dtype"], i["shape"], data[i["data_offsets"][0]:i["data_offsets"][1]])
           for name, i in header.items() if name != "__metadata__"]
    return sorted(out, key=lambda t: header[t[0]]["data_offsets"][0])


def edit(path, op, name):
    tensors = read_raw(path)
    if op == "add":
        tensors.append((name, "F32", [4], np.ones(4, "<f4").tobytes()))
    else:
        (k,) = [i for i, t in enumerate(tensors) if t[0] == name]
        _, dtype, shape, data = tensors[k]
        a = widen(np.frombuffer(data, {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}[dtype]), dtype)
        if op == "drop":
            del tensors[k]
        elif op == "transpose":
            t = np.ascontiguousarray(a.reshape(shape).T)
            stored, data = encode(t, {"F32": "f32", "F16": "f16", "BF16": "bf16"}[dtype])
            tensors[k] = (name, stored, list(t.shape), data)
        elif op == "f64":
            tensors[k] = (name, "F64", shape, a.astype("<f8").tobytes())
    write_safetensors(path, tensors)


def set_index(folder, name, shard):
    path = os.path.join(folder, "model.safetensors.index.json")
    index = json.load(open(path))
    index["weight_map"][name] = shard
    json.dump(index, open(path, "w"), indent=2)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    np_types = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] not in np_types:
            continue
        b, e = info["data_offsets"]
        a = np.frombuffer(data[b:e], dtype=np_types[info["dtype"]]).reshape(info["shape"])
        out[name] = widen(a, info["dtype"])
    return out


def read_folder(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(folder, "model.safetensors"))
    out = {}
    for shard in sorted(set(json.load(open(index))["weight_map"].values())):
        out.update(read_safetensors(os.path.join(folder, shard)))
    return out


def model(kind, rng):
    """(config.json, [(name, float32 array)]) of a tiny model of `kind`."""
    # Weights large enough that the greedy continuations vary (a near-uniform model repeats one
    # token, which would compare little).
    scale = 0.3 if kind == "gpt2" else 0.15

    def w(*shape, std=None):
        return (rng.standard_normal(shape) * (scale if std is None else std)).astype(np.float32)

    def norm():
        return (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)

    if kind == "gpt2":
        config = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
                  "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1,
                  "eos_token_id": 50256, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
                  "model_type": "gpt2", "n_ctx": POSITIONS, "n_embd": D, "n_head": HEADS,
                  "n_inner": None, "n_layer": LAYERS, "n_positions": POSITIONS,
                  "reorder_and_upcast_attn": False, "resid_pdrop": 0.1,
                  "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True,
                  "summary_activation": None, "summary_first_dropout": 0.1,
                  "summary_proj_to_labels": True, "summary_type": "cls_index",
                  "summary_use_proj": True, "task_specific_params": {"text-generation": {
                      "do_sample": True, "max_length": 50}},
                  "torch_dtype": "float32", "transformers_version": "4.40.0", "use_cache": True,
                  "vocab_size": V}
        t = [("wte.weight", w(V, D)), ("wpe.weight", w(POSITIONS, D, std=0.1))]
        for l in range(LAYERS):
            h = f"h.{l}"
            t += [(f"{h}.ln_1.weight", norm()), (f"{h}.ln_1.bias", w(D, std=0.05)),
                  (f"{h}.attn.bias", np.tril(np.ones((POSITIONS, POSITIONS), np.float32))[None, None]),
                  (f"{h}.attn.c_attn.weight", w(D, 3 * D)), (f"{h}.attn.c_attn.bias", w(3 * D, std=0.05)),
                  (f"{h}.attn.c_proj.weight", w(D, D)), (f"{h}.attn.c_proj.bias", w(D, std=0.05)),
                  (f"{h}.ln_2.weight", norm()), (f"{h}.ln_2.bias", w(D, std=0.05)),
                  (f"{h}.mlp.c_fc.weight", w(D, 4 * D)), (f"{h}.mlp.c_fc.bias", w(4 * D, std=0.05)),
                  (f"{h}.mlp.c_proj.weight", w(4 * D, D)), (f"{h}.mlp.c_proj.bias", w(D, std=0.05))]
        t += [("ln_f.weight", norm()), ("ln_f.bias", w(D, std=0.05))]
        return config, t
    tied = kind == "llama_gqa_tied"
    mixtral = kind == "mixtral"
    kv, ffn, experts = 2, 96, 4
    hd = D // HEADS
    config = {"architectures": ["MixtralForCausalLM" if mixtral else "LlamaForCausalLM"],
              "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
              "eos_token_id": 2, "hidden_act": "silu", "hidden_size": D,
              "initializer_range": 0.02, "intermediate_size": ffn,
              "max_position_embeddings": POSITIONS, "model_type": "mixtral" if mixtral else "llama",
              "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
              "num_key_value_heads": kv, "rms_norm_eps": 1e-05,
              "rope_theta": 1000000.0 if mixtral else 10000.0, "tie_word_embeddings": tied,
              "torch_dtype": "bfloat16", "transformers_version": "4.40.0", "use_cache": True,
              "vocab_size": V}
    if mixtral:
        config.update({"num_experts_per_tok": 2, "num_local_experts": experts,
                       "output_router_logits": False, "router_aux_loss_coef": 0.02,
                       "router_jitter_noise": 0.0, "sliding_window": None})
    else:
        config.update({"head_dim": hd, "mlp_bias": False, "pretraining_tp": 1,
                       "rope_scaling": None})
    t = [("model.embed_tokens.weight", w(V, D))]
    for l in range(LAYERS):
        h = f"model.layers.{l}"
        t += [(f"{h}.input_layernorm.weight", norm()),
              (f"{h}.self_attn.q_proj.weight", w(HEADS * hd, D)),
              (f"{h}.self_attn.k_proj.weight", w(kv * hd, D)),
              (f"{h}.self_attn.v_proj.weight", w(kv * hd, D)),
              (f"{h}.self_attn.o_proj.weight", w(D, HEADS * hd)),
              (f"{h}.post_attention_layernorm.weight", norm())]
        if mixtral:
            t.append((f"{h}.block_sparse_moe.gate.weight", w(experts, D)))
            for x in range(experts):
                e = f"{h}.block_sparse_moe.experts.{x}"
                t += [(f"{e}.w1.weight", w(ffn, D)), (f"{e}.w2.weight", w(D, ffn)),
                      (f"{e}.w3.weight", w(ffn, D))]
        else:
            t += [(f"{h}.mlp.gate_proj.weight", w(ffn, D)), (f"{h}.mlp.up_proj.weight", w(ffn, D)),
                  (f"{h}.mlp.down_proj.weight", w(D, ffn))]
    t.append(("model.norm.weight", norm()))
    if not tied:
        t.append(("lm_head.weight", w(V, D)))
    return config, t


def write(kind, out, dtype, shards):
    os.makedirs(out, exist_ok=True)
    config, tensors = model(kind, np.random.default_rng(sum(map(ord, kind))))
    json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
    encoded = []
    for name, a in tensors:
        stored, data = encode(a, dtype)
        encoded.append((name, stored, a.shape, data))
    if shards == 1:
        write_safetensors(os.path.join(out, "model.safetensors"), encoded)
        return
    # Consecutive tensors in shards of about equal bytes, as transformers' save_pretrained does.
    total = sum(len(e[3]) for e in encoded)
    groups, size = [[]], 0
    for e in encoded:
        if size >= total * len(groups) / shards and len(groups) < shards:
            groups.append([])
        groups[-1].append(e)
        size += len(e[3])
    weight_map = {}
    for i, group in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        write_safetensors(os.path.join(out, name), group)
        weight_map.update({e[0]: name for e in group})
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=2)


def compare(hf_dir, exported):
    ours = read_folder(hf_dir)
    theirs = read_safetensors(os.path.join(exported, "model.safetensors"))
    gpt2 = json.load(open(os.path.join(hf_dir, "config.json")))["model_type"] == "gpt2"
    expected = {}
    for name, a in ours.items():
        if gpt2 and name.endswith(".attn.bias"):
            continue  # a buffer, not a parameter
        expected[name if not gpt2 or name.startswith("transformer.") else "transformer." + name] = a
    problems = [f"missing {n}" for n in expected if n not in theirs]
    problems += [f"extra {n}" for n in theirs if n not in expected]
    for name, a in expected.items():
        b = theirs.get(name)
        if b is not None and (a.shape != b.shape or not np.array_equal(a.view(np.uint32), b.view(np.uint32))):
            problems.append(f"{name}: {list(a.shape)} vs {list(b.shape)}, values differ")
    if problems:
        print("FAIL: " + "; ".join(problems[:10]))
        return 1
    print(f"{len(expected)} tensors bitwise equal")
    return 0


def check_import(checkpoint):
    meta = json.load(open(os.path.join(checkpoint, "meta.json")))
    assert meta["step"] == 0 and meta["optimizer"]["steps_taken"] == 0, meta
    state = read_safetensors(os.path.join(checkpoint, "model-rank00000.safetensors"))
    moments = [a for n, a in state.items() if n.startswith(("adam_m/", "adam_v/"))]
    params = [n for n in state if n.startswith("param/")]
    assert len(moments) == 2 * len(params) > 0, (len(moments), len(params))
    assert all(not a.any() for a in moments), "nonzero AdamW moments"
    print(f"{len(params)} parameters, zero moments, step 0")
    return 0


def same_params(a, b):
    def params(ck):  # a one-rank run's: each tensor whole in one of its files
        meta = json.load(open(os.path.join(ck, "meta.json")))
        state = {}
        for f in meta["files"]:
            state.update(read_safetensors(os.path.join(ck, f)))
        return {n: v for n, v in state.items() if n.startswith("param/")}, meta.get("moe_bias")
    (pa, ba), (pb, bb) = params(a), params(b)
    problems = [f"only in {a}: {n}" for n in pa.keys() - pb.keys()]
    problems += [f"only in {b}: {n}" for n in pb.keys() - pa.keys()]
    problems += [f"{n} differs" for n in pa.keys() & pb.keys()
                 if pa[n].shape != pb[n].shape or pa[n].tobytes() != pb[n].tobytes()]
    if ba != bb:
        problems.append(f"router biases differ: {ba} vs {bb}")
    if problems:
        print("FAIL: " + "; ".join(sorted(problems)[:10]))
        return 1
    print(f"{len(pa)} parameters bitwise equal" + (f", router biases of {len(ba)} layers" if ba else ""))
    return 0


def main():
    cmd = sys.argv[1]
    if cmd == "write":
        args = sys.argv[2:]
        dtype = args[args.index("--dtype") + 1] if "--dtype" in args else "bf16"
        shards = int(args[args.index("--shards") + 1]) if "--shards" in args else 1
        write(args[0], args[1], dtype, shards)
        return 0
    if cmd == "compare":
        return compare(sys.argv[2], sys.argv[3])
    if cmd == "check-import":
        return check_import(sys.argv[2])
    if cmd == "edit":
        edit(*sys.argv[2:5])
        return 0
    if cmd == "index":
        set_index(*sys.argv[2:5])
        return 0
    if cmd == "same-params":
        return same_params(sys.argv[2], sys.argv[3])
    raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    sys.exit(main())
