"""The PyTorch peer of bench/inference.sh: greedy generation with a key/value cache, timed as
`cleave generate --warmup` times it, on the model cleave exported (`cleave export CKPT HF_DIR`).

The model is tests/integration/torch_reference.py's (GPT-2 or Llama from the Hugging Face folder,
plain torch ops), with its KVCache: the prompt's forward fills the cache, then each step runs its
one new token. Weights in float32, or cast to bfloat16 once (the products in bf16, as cleave's
--dtype bf16; the cache in the weights' dtype).

    torch_generate.py HF_DIR --dtype fp32|bf16 --threads N --prompt-ids "ID ..." --max-new-tokens N
        [--batch N]

A run untimed first (the prompt and 2 tokens: the allocator's and the libraries' first-use costs),
then the timed one. Prefill is the time to the first token (the prompt's forward and its argmax),
decode the rest, one forward a token, as cleave counts them. Prints:
    tokens <prompt ids> | <new ids>          (the first sequence's)
    # prefill: P tokens in X ms (Y tokens/s); decode: D tokens in Z ms (W tokens/s)"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
import torch_reference as ref  # noqa: E402  (found through the path above)


def load(folder, dtype):
    """(config, forward, parameters in dtype, the cache's shape: layers, kv heads, head size)."""
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    values = ref.read_safetensors(os.path.join(folder, "model.safetensors"))
    p = {n: torch.from_numpy(v).to(dtype) for n, v in values.items()}
    if ref.family_of(c) == "gpt2":
        heads = c["n_head"]
        return c, ref.gpt2_forward, p, (c["n_layer"], heads, c["n_embd"] // heads)
    heads = c["num_attention_heads"]
    return c, ref.llama_forward, p, (c["num_hidden_layers"], c.get("num_key_value_heads", heads),
                                     c["hidden_size"] // heads)


def generate(model, prompt, batch, steps, dtype):
    """Greedy: (the first sequence's new tokens, prefill seconds, decode seconds)."""
    c, forward, p, (layers, kv_heads, head_dim) = model
    cache = ref.KVCache(layers, batch, kv_heads, len(prompt) + steps, head_dim, dtype)
    start = time.perf_counter()
    logits, _ = forward(c, p, torch.tensor([prompt] * batch), None, cache)
    token = logits[:, -1].argmax(-1, keepdim=True)
    first = time.perf_counter()
    out = [token]
    for _ in range(steps - 1):
        logits, _ = forward(c, p, token, None, cache)
        token = logits[:, -1].argmax(-1, keepdim=True)
        out.append(token)
    end = time.perf_counter()
    return [int(t[0, 0]) for t in out], first - start, end - first


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", help="a Hugging Face folder from `cleave export`")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    prompt = [int(t) for t in args.prompt_ids.split()]
    steps = args.max_new_tokens

    with torch.inference_mode():
        model = load(args.folder, dtype)
        generate(model, prompt, args.batch, min(steps, 2), dtype)
        tokens, prefill_s, decode_s = generate(model, prompt, args.batch, steps, dtype)
    print("tokens " + " ".join(map(str, prompt)) + " | " + " ".join(map(str, tokens)))
    P, D = args.batch * len(prompt), args.batch * (steps - 1)
    print(f"# prefill: {P} tokens in {prefill_s * 1e3:.1f} ms ({P / prefill_s:.1f} tokens/s); "
          f"decode: {D} tokens in {decode_s * 1e3:.1f} ms "
          f"({D / decode_s if D else 0.0:.1f} tokens/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
