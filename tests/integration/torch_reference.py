#!/usr/bin/env python3
"""Checks cleave's whole model against an independent PyTorch implementation.

Usage: torch_reference.py [--tolerance TOL] [--float64] [--sabotage WHAT] [--self-test]
                          DUMP_DIR [DUMP_DIR ...]

A mixture of experts (MixtralForCausalLM, or cleave's own "cleave_moe" layout: docs/checkpoints.md)
is rebuilt the same way, every expert run on every token and weighted by its gate (zero unless
chosen); the loss differentiated adds the balancing terms as cleave defines them (the auxiliary
loss per sequence, the z-loss per token), while the loss compared is the cross-entropy alone.
--greedy HF_DIR [HF_DIR ...] decodes greedily from --prompt-ids with the reference (no cache) and
prints the prompt and continuation ids as `cleave generate --ids` does, a line per folder.
The forwards also take a KVCache: the prompt's keys and values kept, each further forward runs
only its new tokens (bench/torch_generate.py, the inference benchmark's PyTorch peer).

Each DUMP_DIR is what tests/tools/model_dump wrote: config.json (Hugging Face config),
model.safetensors (parameters under Hugging Face names and layouts), grads.safetensors (cleave's
gradients of the mean loss, same names) and outputs.safetensors (tokens, targets, logits, loss).
The model is rebuilt here from the Hugging Face description alone (GPT2LMHeadModel or
LlamaForCausalLM semantics, written out with plain torch ops), run on the same tokens, and
differentiated by autograd. Logits, loss and every parameter's gradient are compared with
    rel = max|cleave - torch| / max(max|torch|, tiny)
per tensor; any rel above the tolerance, or a tensor missing from or extra in cleave's files,
fails (exit status 1).

--sabotage deliberately breaks the reference (exact GELU, flipped RoPE sign, no causal mask, a
wrong norm epsilon, the wrong grouped-query grouping, the other softmax router's gates, the
auxiliary loss over the batch instead of per sequence), to see the comparison fail. --self-test
does this for every applicable sabotage after the real comparison and fails unless each is caught.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

TINY = 1e-30
SABOTAGES = ("gelu_exact", "rope_sign", "no_causal_mask", "norm_eps", "gqa_tile", "moe_gates",
             "aux_per_batch")


# --- safetensors, read by hand ------------------------------------------------------------------

_DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64,
           "F16": np.float16, "BF16": np.uint16, "U8": np.uint8, "I8": np.int8}


def read_safetensors(path):
    """{name: numpy array} of a safetensors file (BF16 widened to float32)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} exceeds the file size {len(raw)}")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        if dtype not in _DTYPES:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {dtype}")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        np_dtype = np.dtype(_DTYPES[dtype]).newbyteorder("<")
        count = int(np.prod(shape)) if shape else 1
        if end - begin != count * np_dtype.itemsize or end > len(data):
            raise ValueError(f"{path}: tensor {name}: offsets [{begin}, {end}) do not fit "
                             f"shape {list(shape)} of {dtype}")
        a = np.frombuffer(data, dtype=np_dtype, count=count, offset=begin).reshape(shape)
        if dtype == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a.astype(a.dtype.newbyteorder("="))
    return out


# --- the reference models -----------------------------------------------------------------------

# --- mixture of experts -------------------------------------------------------------------------

def moe_spec(c):
    """None for a dense model; else (is_moe(layer), experts, top_k, router, shared experts, expert
    hidden units, names) where names(h) gives the gate, experts' and shared experts' prefixes."""
    if c.get("model_type") == "mixtral":
        E = c["num_local_experts"]
        return (lambda l: True, E, c["num_experts_per_tok"], "topk_softmax", 0,
                c["intermediate_size"],
                lambda h: (f"{h}.block_sparse_moe.gate", f"{h}.block_sparse_moe.experts", None))
    if c.get("model_type") == "cleave_moe":
        first, every = c["moe_first_dense"], c["moe_every"]
        return (lambda l: l >= first and l % every == 0, c["moe_experts"], c["moe_top_k"],
                c["moe_router"], c["moe_shared_experts"], c["moe_ffn_hidden"],
                lambda h: (f"{h}.mlp.gate", f"{h}.mlp.experts", f"{h}.mlp.shared_experts"))
    return None


def moe_ffn(c, p, spec, h, x, mlp, sabotage):
    """The MoE layer on x [B, T, d] with mlp(prefix, y) the family's MLP; returns (output, the
    layer's balancing terms as cleave adds them to the loss)."""
    _, E, k, router, shared, _, names = spec
    gate, experts, shared_prefix = names(h)
    logits = x @ p[gate + ".weight"].t()
    if router == "sigmoid_bias":
        s = torch.sigmoid(logits)
        bias = p.get(gate + ".e_score_correction_bias")
        key = s + (bias if bias is not None else 0)
        idx = torch.topk(key.detach(), k, dim=-1).indices
        g = s.gather(-1, idx)
        g = g / g.sum(-1, keepdim=True)
        probs = s / s.sum(-1, keepdim=True)
    else:
        probs = torch.softmax(logits, dim=-1)
        idx = torch.topk(logits.detach(), k, dim=-1).indices
        renormalise = router == "topk_softmax"
        if sabotage == "moe_gates":  # the other softmax router's gates
            renormalise = not renormalise
        g = torch.softmax(logits.gather(-1, idx), dim=-1) if renormalise else probs.gather(-1, idx)
    out = torch.zeros_like(x)
    for e in range(E):
        weight = (g * (idx == e)).sum(-1, keepdim=True)
        out = out + weight * mlp(f"{experts}.{e}", x)
    if shared:
        out = out + mlp(shared_prefix, x)
    B, T, _ = x.shape
    f = torch.stack([(idx == e).sum(dim=(1, 2)) for e in range(E)], dim=-1).to(x.dtype) / (T * k)
    P = probs.mean(dim=1)
    if sabotage == "aux_per_batch":  # Mixtral's form: f and P over the whole batch
        f, P = f.mean(0, keepdim=True), P.mean(0, keepdim=True)
    aux = c.get("router_aux_loss_coef", 0.0) * E * (f * P).sum(-1).mean()
    z = c.get("router_z_loss_coef", 0.0) * torch.logsumexp(logits, dim=-1).pow(2).mean()
    return out, aux + z


def moe_shapes(c, s, spec, prefix, d, mlp_shapes):
    """Replaces the MLP tensors of every MoE layer in s by the router's and the experts'."""
    is_moe, E, _, router, shared, hidden, names = spec
    for l in range(c.get("num_hidden_layers", c.get("n_layer"))):
        if not is_moe(l):
            continue
        h = f"{prefix}.{l}"
        for name in [n for n in s if n.startswith(f"{h}.mlp.")]:
            del s[name]
        gate, experts, shared_prefix = names(h)
        s[gate + ".weight"] = (E, d)
        if router == "sigmoid_bias":
            s[gate + ".e_score_correction_bias"] = (E,)
        for e in range(E):
            s.update(mlp_shapes(f"{experts}.{e}", hidden))
        if shared:
            s.update(mlp_shapes(shared_prefix, shared * hidden))
    return s


def gpt2_mlp_shapes(d):
    return lambda to, inner: {f"{to}.c_fc.weight": (d, inner), f"{to}.c_fc.bias": (inner,),
                              f"{to}.c_proj.weight": (inner, d), f"{to}.c_proj.bias": (d,)}


def llama_mlp_shapes(d, mixtral):
    if mixtral:
        return lambda to, Fh: {f"{to}.w1.weight": (Fh, d), f"{to}.w3.weight": (Fh, d),
                               f"{to}.w2.weight": (d, Fh)}
    return lambda to, Fh: {f"{to}.gate_proj.weight": (Fh, d), f"{to}.up_proj.weight": (Fh, d),
                           f"{to}.down_proj.weight": (d, Fh)}


def gpt2_shapes(c):
    d, V, L, P = c["n_embd"], c["vocab_size"], c["n_layer"], c["n_positions"]
    inner = c.get("n_inner") or 4 * d
    s = {"transformer.wte.weight": (V, d), "transformer.wpe.weight": (P, d)}
    for l in range(L):
        h = f"transformer.h.{l}"
        s.update({
            f"{h}.ln_1.weight": (d,), f"{h}.ln_1.bias": (d,),
            f"{h}.attn.c_attn.weight": (d, 3 * d), f"{h}.attn.c_attn.bias": (3 * d,),
            f"{h}.attn.c_proj.weight": (d, d), f"{h}.attn.c_proj.bias": (d,),
            f"{h}.ln_2.weight": (d,), f"{h}.ln_2.bias": (d,),
        })
        s.update(gpt2_mlp_shapes(d)(f"{h}.mlp", inner))
    s["transformer.ln_f.weight"] = (d,)
    s["transformer.ln_f.bias"] = (d,)
    if not c.get("tie_word_embeddings", True):
        s["lm_head.weight"] = (V, d)
    spec = moe_spec(c)
    return moe_shapes(c, s, spec, "transformer.h", d, gpt2_mlp_shapes(d)) if spec else s


def llama_shapes(c):
    d, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    H = c["num_attention_heads"]
    KV = c.get("num_key_value_heads", H)
    hd = d // H
    Fh = c["intermediate_size"]
    s = {"model.embed_tokens.weight": (V, d)}
    for l in range(L):
        h = f"model.layers.{l}"
        s.update({
            f"{h}.input_layernorm.weight": (d,),
            f"{h}.self_attn.q_proj.weight": (H * hd, d),
            f"{h}.self_attn.k_proj.weight": (KV * hd, d),
            f"{h}.self_attn.v_proj.weight": (KV * hd, d),
            f"{h}.self_attn.o_proj.weight": (d, H * hd),
            f"{h}.post_attention_layernorm.weight": (d,),
        })
        s.update(llama_mlp_shapes(d, False)(f"{h}.mlp", Fh))
    s["model.norm.weight"] = (d,)
    if not c.get("tie_word_embeddings", False):
        s["lm_head.weight"] = (V, d)
    spec = moe_spec(c)
    if spec:
        mixtral = c["model_type"] == "mixtral"
        s = moe_shapes(c, s, spec, "model.layers", d, llama_mlp_shapes(d, mixtral))
    return s


class KVCache:
    """The keys and values (kv heads, after RoPE) of every layer for positions [0, length), in
    tensors of `capacity` positions allocated once, so that a step copies only its own rows."""

    def __init__(self, layers, batch, kv_heads, capacity, head_dim, dtype):
        shape = (batch, kv_heads, capacity, head_dim)
        self.k = [torch.empty(shape, dtype=dtype) for _ in range(layers)]
        self.v = [torch.empty(shape, dtype=dtype) for _ in range(layers)]
        self.length = 0

    def extend(self, layer, k, v):
        """Stores the new positions' k, v [B, kv_heads, T, hd] of a layer after the cached ones;
        returns the layer's keys and values of every position so far."""
        end = self.length + k.shape[2]
        self.k[layer][:, :, self.length:end] = k
        self.v[layer][:, :, self.length:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]


def causal_attention(q, k, v, sabotage):
    """q: [B, H, Tq, hd]; k, v: [B, H, Tk, hd] (kv heads already repeated), Tk >= Tq: the queries
    are the last Tq positions (Tk > Tq after a cache's). Explicit masked softmax."""
    Tq, Tk, hd = q.shape[-2], k.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    if sabotage != "no_causal_mask":
        mask = torch.triu(torch.ones(Tq, Tk, dtype=torch.bool), diagonal=Tk - Tq + 1)
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def gelu_tanh(x, sabotage):
    if sabotage == "gelu_exact":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def gpt2_forward(c, p, tokens, sabotage, cache=None):
    """Logits [B, T, V] of tokens [B, T] and the balancing terms; with a KVCache, tokens are the
    positions after the cache's, their keys and values added to it."""
    B, T = tokens.shape
    d, H = c["n_embd"], c["n_head"]
    hd = d // H
    eps = c.get("layer_norm_epsilon", 1e-5)
    if sabotage == "norm_eps":
        eps = eps * 1000
    past = cache.length if cache is not None else 0
    pos = torch.arange(past, past + T)
    x = p["transformer.wte.weight"][tokens] + p["transformer.wpe.weight"][pos][None]

    def conv1d(y, name):  # Hugging Face Conv1D: y @ W + b, W stored [in, out]
        return y @ p[name + ".weight"] + p[name + ".bias"]

    def heads(y):  # [B, T, d] -> [B, H, T, hd]
        return y.view(B, T, H, hd).transpose(1, 2)

    spec = moe_spec(c)
    extra = 0.0

    def mlp(prefix, y):
        return conv1d(gelu_tanh(conv1d(y, prefix + ".c_fc"), sabotage), prefix + ".c_proj")

    for l in range(c["n_layer"]):
        h = f"transformer.h.{l}"
        a = F.layer_norm(x, (d,), p[h + ".ln_1.weight"], p[h + ".ln_1.bias"], eps)
        qkv = conv1d(a, h + ".attn.c_attn")
        q, k, v = (heads(y) for y in qkv.split(d, dim=-1))
        if cache is not None:
            k, v = cache.extend(l, k, v)
        o = causal_attention(q, k, v, sabotage)
        o = o.transpose(1, 2).reshape(B, T, d)
        x = x + conv1d(o, h + ".attn.c_proj")
        m = F.layer_norm(x, (d,), p[h + ".ln_2.weight"], p[h + ".ln_2.bias"], eps)
        if spec and spec[0](l):
            y, terms = moe_ffn(c, p, spec, h, m, mlp, sabotage)
            x, extra = x + y, extra + terms
        else:
            x = x + mlp(h + ".mlp", m)
    if cache is not None:
        cache.length += T
    x = F.layer_norm(x, (d,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps)
    head = p["transformer.wte.weight"] if c.get("tie_word_embeddings", True) else p["lm_head.weight"]
    return x @ head.t(), extra


def rms_norm(x, w, eps):
    xf = x.float()
    var = xf.pow(2).mean(-1, keepdim=True)
    return w * (xf * torch.rsqrt(var + eps)).to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def llama_forward(c, p, tokens, sabotage, cache=None):
    """As gpt2_forward, for Llama and Mixtral."""
    B, T = tokens.shape
    d, H = c["hidden_size"], c["num_attention_heads"]
    KV = c.get("num_key_value_heads", H)
    hd = d // H
    eps = c.get("rms_norm_eps", 1e-6)
    if sabotage == "norm_eps":
        eps = eps * 1000
    theta = c.get("rope_theta", 10000.0)
    dtype = p["model.embed_tokens.weight"].dtype

    # Rotate-half RoPE as Hugging Face Llama: inv_freq[i] = theta^(-2i/hd), i < hd/2; element i of a
    # head pairs with element i + hd/2. Angles in float64, then cast.
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    past = cache.length if cache is not None else 0
    ang = torch.outer(torch.arange(past, past + T, dtype=torch.float64), inv_freq)
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    if sabotage == "rope_sign":
        sin = -sin

    def rope(y):  # [B, heads, T, hd]
        return y * cos + rotate_half(y) * sin

    spec = moe_spec(c)
    extra = 0.0

    def mlp(prefix, y):
        if c["model_type"] == "mixtral":
            return (F.silu(y @ p[prefix + ".w1.weight"].t()) * (y @ p[prefix + ".w3.weight"].t())) \
                @ p[prefix + ".w2.weight"].t()
        return (F.silu(y @ p[prefix + ".gate_proj.weight"].t()) *
                (y @ p[prefix + ".up_proj.weight"].t())) @ p[prefix + ".down_proj.weight"].t()

    x = p["model.embed_tokens.weight"][tokens]
    for l in range(c["num_hidden_layers"]):
        h = f"model.layers.{l}"
        a = rms_norm(x, p[h + ".input_layernorm.weight"], eps)
        q = (a @ p[h + ".self_attn.q_proj.weight"].t()).view(B, T, H, hd).transpose(1, 2)
        k = (a @ p[h + ".self_attn.k_proj.weight"].t()).view(B, T, KV, hd).transpose(1, 2)
        v = (a @ p[h + ".self_attn.v_proj.weight"].t()).view(B, T, KV, hd).transpose(1, 2)
        q, k = rope(q), rope(k)
        if cache is not None:
            k, v = cache.extend(l, k, v)
        rep = H // KV
        if rep > 1:  # (one query head per kv head: nothing to repeat, and no copy of the cache)
            if sabotage == "gqa_tile":  # wrong grouping: query head h uses kv head h % KV
                k, v = k.repeat(1, rep, 1, 1), v.repeat(1, rep, 1, 1)
            else:  # Hugging Face repeat_kv: query head h uses kv head h // rep
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = causal_attention(q, k, v, sabotage).transpose(1, 2).reshape(B, T, H * hd)
        x = x + o @ p[h + ".self_attn.o_proj.weight"].t()
        m = rms_norm(x, p[h + ".post_attention_layernorm.weight"], eps)
        if spec and spec[0](l):
            y, terms = moe_ffn(c, p, spec, h, m, mlp, sabotage)
            x, extra = x + y, extra + terms
        else:
            x = x + mlp(h + ".mlp", m)
    if cache is not None:
        cache.length += T
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if c.get("tie_word_embeddings", False) else p["lm_head.weight"]
    return x @ head.t(), extra


# --- the comparison -----------------------------------------------------------------------------

def rel_err(cleave, ref):
    a = np.asarray(cleave, dtype=np.float64)
    b = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), TINY)) if b.size else 0.0


def applicable_sabotages(c):
    """The ways to break the reference that must change this model's results."""
    spec = moe_spec(c)
    moe = []
    if spec and spec[3] != "sigmoid_bias":
        moe.append("moe_gates")
    if spec and c.get("router_aux_loss_coef", 0) > 0:
        moe.append("aux_per_batch")
    if family_of(c) == "gpt2":
        return ["gelu_exact", "no_causal_mask", "norm_eps"] + moe
    out = ["rope_sign", "no_causal_mask", "norm_eps"]
    H = c["num_attention_heads"]
    KV = c.get("num_key_value_heads", H)
    if 1 < KV < H:  # with one kv head, or one per query head, both groupings coincide
        out.append("gqa_tile")
    return out + moe


def family_of(c):
    """"gpt2" or "llama": the attention and norms the model is built of."""
    model_type = c.get("model_type")
    if model_type == "cleave_moe":
        model_type = c.get("base_model_type")
    if model_type == "mixtral":
        return "llama"
    if model_type not in ("gpt2", "llama"):
        raise ValueError(f"config.json: unknown model_type {c.get('model_type')!r}")
    return model_type


def load_dump(dump):
    """(config, expected shapes, forward, values, grads, outputs, problems): problems lists what is
    missing, extra or misshapen; the reference cannot run if a parameter or output is unusable."""
    with open(os.path.join(dump, "config.json")) as f:
        c = json.load(f)
    shapes, forward = (gpt2_shapes(c), gpt2_forward) if family_of(c) == "gpt2" \
        else (llama_shapes(c), llama_forward)
    values = read_safetensors(os.path.join(dump, "model.safetensors"))
    grads = read_safetensors(os.path.join(dump, "grads.safetensors"))
    outputs = read_safetensors(os.path.join(dump, "outputs.safetensors"))

    problems = []
    for what, tensors in (("model.safetensors", values), ("grads.safetensors", grads)):
        for name in sorted(set(shapes) - set(tensors)):
            problems.append(f"{what}: missing tensor {name} (expected shape {list(shapes[name])})")
        for name in sorted(set(tensors) - set(shapes)):
            problems.append(f"{what}: unexpected tensor {name} {list(tensors[name].shape)}")
        for name in sorted(set(shapes) & set(tensors)):
            if tuple(tensors[name].shape) != shapes[name]:
                problems.append(f"{what}: {name} has shape {list(tensors[name].shape)}, "
                                f"expected {list(shapes[name])}")
    for name in ("tokens", "targets", "logits", "loss"):
        if name not in outputs:
            problems.append(f"outputs.safetensors: missing tensor {name}")
    if "tokens" in outputs and "targets" in outputs:
        B, T = outputs["tokens"].shape
        if outputs["targets"].shape != (B, T):
            problems.append(f"outputs.safetensors: targets has shape "
                            f"{list(outputs['targets'].shape)}, expected {[B, T]}")
        if "logits" in outputs and outputs["logits"].shape != (B, T, c["vocab_size"]):
            problems.append(f"outputs.safetensors: logits has shape {list(outputs['logits'].shape)}"
                            f", expected {[B, T, c['vocab_size']]}")
        if "loss" in outputs and outputs["loss"].size != 1:
            problems.append(f"outputs.safetensors: loss has shape {list(outputs['loss'].shape)}, "
                            f"expected [1]")
    return c, shapes, forward, values, grads, outputs, problems


def compare(d, dtype, sabotage):
    """Runs the reference on a loaded dump; returns ([(tensor, rel err)], torch loss)."""
    c, shapes, forward, values, grads, outputs, _ = d
    params = {n: torch.tensor(values[n], dtype=dtype, requires_grad=True) for n in shapes}
    tokens = torch.from_numpy(outputs["tokens"].astype(np.int64))
    targets = torch.from_numpy(outputs["targets"].astype(np.int64))
    B, T = tokens.shape
    V = c["vocab_size"]
    logits, extra = forward(c, params, tokens, sabotage)
    loss = F.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T))
    (loss + extra).backward()
    rows = [("logits", rel_err(outputs["logits"], logits.detach().numpy())),
            ("loss", rel_err(outputs["loss"].reshape(()), loss.detach().numpy()))]
    for name in shapes:
        if name in grads and tuple(grads[name].shape) == shapes[name]:
            g = params[name].grad
            ref = g.numpy() if g is not None else np.zeros(shapes[name])
            rows.append(("grad " + name, rel_err(grads[name], ref)))
    return rows, loss.item()


def worst_of(rows):
    return max((r if not math.isnan(r) else float("inf")) for _, r in rows)


def check_dump(dump, tolerance, dtype, sabotage, self_test):
    """Prints the table of one dump; returns its failure messages."""
    d = load_dump(dump)
    c, outputs, problems = d[0], d[5], d[6]
    failures = list(problems)
    unusable = any("model.safetensors" in p or "outputs.safetensors" in p for p in problems)
    if unusable:  # the reference cannot run without every parameter and output
        return failures
    rows, torch_loss = compare(d, dtype, sabotage)
    B, T = outputs["tokens"].shape
    width = max(len(r[0]) for r in rows)
    print(f"== {dump} ({c['model_type']}, B={B} T={T} V={c['vocab_size']}, loss cleave "
          f"{float(outputs['loss'].reshape(())):.6f} torch {torch_loss:.6f}"
          f"{', reference sabotaged: ' + sabotage if sabotage else ''})")
    print(f"  {'tensor':<{width}}  rel err")
    for name, r in rows:
        bad = not (r <= tolerance)
        print(f"  {name:<{width}}  {r:.3e}{'  FAIL' if bad else ''}")
        if bad:
            failures.append(f"{name}: relative error {r:.3e} exceeds the tolerance {tolerance:.1e}")
    print(f"  max rel err {worst_of(rows):.3e}")

    if self_test:  # each way of breaking the reference must be caught on this dump
        for s in applicable_sabotages(c):
            w = worst_of(compare(d, dtype, s)[0])
            caught = not (w <= tolerance)
            print(f"  self-test: reference broken by {s}: max rel err {w:.3e}, "
                  f"{'caught' if caught else 'NOT CAUGHT'}")
            if not caught:
                failures.append(f"self-test: the reference broken by {s} still matches "
                                f"(max rel err {w:.3e}): the comparison cannot see that change")
    return failures


def greedy(folder, prompt, steps):
    """The prompt and its greedy continuation by the reference, from an exported folder."""
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    forward = gpt2_forward if family_of(c) == "gpt2" else llama_forward
    values = read_safetensors(os.path.join(folder, "model.safetensors"))
    p = {n: torch.tensor(v) for n, v in values.items()}
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            logits, _ = forward(c, p, torch.tensor([ids]), None)
            ids.append(int(torch.argmax(logits[0, -1])))
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dumps", nargs="*", help="folders written by model_dump")
    ap.add_argument("--greedy", metavar="HF_DIR", nargs="+",
                    help="decode greedily from exported folders")
    ap.add_argument("--prompt-ids", default="", help="--greedy's prompt, token ids")
    ap.add_argument("--max-new-tokens", type=int, default=20)
    ap.add_argument("--tolerance", type=float, default=1e-4,
                    help="largest relative error allowed per tensor (default 1e-4, for fp32)")
    ap.add_argument("--float64", action="store_true", help="run the reference in float64")
    ap.add_argument("--sabotage", choices=SABOTAGES, help="break the reference on purpose")
    ap.add_argument("--self-test", action="store_true",
                    help="also check that every applicable sabotage of the reference is caught")
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    dtype = torch.float64 if args.float64 else torch.float32
    torch.set_default_dtype(dtype)
    if args.greedy:
        prompt = [int(t) for t in args.prompt_ids.split()]
        for folder in args.greedy:
            ids = greedy(folder, prompt, args.max_new_tokens)
            print(" ".join(map(str, prompt)) + " | " + " ".join(map(str, ids[len(prompt):])))
        return 0

    all_failures = []
    for dump in args.dumps:
        try:
            failures = check_dump(dump, args.tolerance, dtype, args.sabotage, args.self_test)
        except Exception as e:  # a malformed dump is a failure, with its reason
            failures = [f"{type(e).__name__}: {e}"]
        all_failures += [f"{dump}: {f}" for f in failures]
    if all_failures:
        print(f"\nFAILED: cleave disagrees with the PyTorch reference "
              f"({len(all_failures)} problems):", file=sys.stderr)
        for f in all_failures:
            print("  " + f, file=sys.stderr)
        return 1
    print(f"\nOK: {len(args.dumps)} model(s) match the PyTorch reference within "
          f"{args.tolerance:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
