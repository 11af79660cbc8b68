// The load generator of bench/serve.sh: clients of `cleave serve` through the official OpenAI
// client (npm "openai" 5.23.2, tests/integration/openai_client/install.sh), in one Node process
// (the server has the machine's 2 cores; a client costs it little). Every request is a streamed
// completion of a token-id prompt (/v1/completions, stream=true, temperature and a seed), timed as
// its chunks arrive. Also the request mix and the figures llama_cpp_bench.mjs's "serve" part uses,
// so that llama.cpp serves the same requests, counted the same way.
//   node serve_load.mjs NPM_DIR BASE_URL KEY MODEL SPEC_JSON
// SPEC_JSON's parts, each optional, run in this order:
//   "warmup": {"clients": C, "requests": R, "mix": MIX}            untimed
//   "levels": {"clients": [C, ...], "requests": [R, ...], "mix": MIX}
//   "interference": {"clients": C, "prompt": P, "long": L, "cycles": K, "before_ms": B, "mix": MIX}
//   "prefix": {"tokens": N, "shared": S, "pairs": K, "mix": MIX}
// MIX: {"seed", "vocab", "prompt": [lo, hi], "output": [lo, hi], "temperature"}: prompt and output
// lengths log-uniform in [lo, hi] (short ones more often, as real traffic), token ids uniform.
// Prints, one a line (times in ms):
//   level <clients> <requests> <new tokens> <seconds> <tokens/s> <ttft p50> <gap p50> <gap p99> <steps> <prompt tokens>
//     C clients each sending the level's next request as soon as its last ended (R in all, the
//     same R for a level at every run); tokens/s: the new tokens of all over the wall time from
//     the first request to the last token; ttft: request sent to its first token; gap: between a
//     stream's successive tokens, pooled over all streams; steps: the server's forward steps
//     (/metrics cleave_steps_total) over the level, "-" where there is no /metrics.
//   interference <before gap p50> <before p99> <during gap p50> <during p99> <long ttft p50> <steps during>
//     C clients decoding back to back (prompts of P tokens, outputs of the mix's longest), then K
//     times: B ms of their gaps, then an L-token prompt sent; "during" are the gaps that end
//     between its sending and its first token (its prefill), "before" those of the B ms before.
//   prefix <cold ttft p50> <shared ttft p50> <shared tokens per request>
//     K pairs, one at a time on an idle server: an N-token prompt (cold), then one whose first S
//     tokens are the cold one's; shared: the rise of /metrics cleave_prefix_cached_tokens_total.
import { createRequire } from "node:module";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { pathToFileURL } from "node:url";

// --- shared with llama_cpp_bench.mjs -------------------------------------------------------------

// mulberry32: a small seeded generator, the same sequence in every program.
export function random(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const logUniform = (u, [lo, hi]) => Math.min(hi, Math.floor(Math.exp(Math.log(lo) + u() * (Math.log(hi + 1) - Math.log(lo)))));
export const randomIds = (u, n, vocab) => Array.from({ length: n }, () => 3 + Math.floor(u() * (vocab - 3)));

// COUNT requests of a mix, the same for a (mix, salt) everywhere: {prompt: [ids], max_tokens, seed}.
export function requests(mix, count, salt) {
  const u = random(mix.seed * 7919 + salt);
  return Array.from({ length: count }, (_, i) => {
    const prompt = logUniform(u, mix.prompt), max_tokens = logUniform(u, mix.output);
    return { prompt: randomIds(u, prompt, mix.vocab), max_tokens, seed: mix.seed * 100003 + salt * 1009 + i };
  });
}

// The value at quantile q (nearest rank) of an array of numbers; NaN if empty.
export function quantile(xs, q) {
  if (xs.length === 0) return NaN;
  const s = Float64Array.from(xs).sort();
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))];
}
const ms = (x) => (Number.isFinite(x) ? x.toFixed(1) : "-");

// Runs REQUESTS with CLIENTS concurrent loops of `one(request, client)`, each taking the next
// request as soon as its last ended. one() resolves to {sent, times: [token arrival times], tokens}.
export async function closedLoop(clients, reqs, one) {
  let next = 0;
  const done = [];
  const start = performance.now();
  await Promise.all(Array.from({ length: clients }, async (_, c) => {
    while (next < reqs.length) done.push(await one(reqs[next++], c));
  }));
  const end = Math.max(start, ...done.map((d) => (d.times.length ? d.times[d.times.length - 1] : d.sent)));
  const tokens = done.reduce((s, d) => s + d.tokens, 0);
  const ttft = done.filter((d) => d.times.length).map((d) => d.times[0] - d.sent);
  const gaps = done.flatMap((d) => d.times.slice(1).map((t, i) => t - d.times[i]));
  const prompts = reqs.reduce((s, r) => s + r.prompt.length, 0);
  return { tokens, prompts, seconds: (end - start) / 1e3, ttft, gaps };
}

export function levelLine(clients, count, r, steps = "-") {
  return `level ${clients} ${count} ${r.tokens} ${r.seconds.toFixed(2)} ${(r.tokens / r.seconds).toFixed(1)} ` +
    `${ms(quantile(r.ttft, 0.5))} ${ms(quantile(r.gaps, 0.5))} ${ms(quantile(r.gaps, 0.99))} ${steps} ${r.prompts}`;
}

// --- the OpenAI client's side ------------------------------------------------------------------

async function main() {
  const [npmDir, baseURL, apiKey, model, specJson] = process.argv.slice(2);
  const spec = JSON.parse(specJson);
  const require = createRequire(path.join(npmDir, "package.json"));
  const OpenAI = require("openai").default ?? require("openai");
  const client = new OpenAI({ baseURL: baseURL + "/v1", apiKey, maxRetries: 0, timeout: 600e3 });

  const metric = async (name) => {
    const text = await (await fetch(baseURL + "/metrics")).text();
    const line = text.split("\n").find((l) => l.startsWith(name + " "));
    return line ? Number(line.split(" ")[1]) : NaN;
  };

  // One streamed request: the arrival time of each token's chunk. It asks for logprobs 0 (the
  // chosen token's log-probability, no alternatives) so that every token makes a chunk and is
  // counted in it: without them a token whose text is empty (inside a UTF-8 character, or a
  // special token) sends no chunk until the next, which would merge two gaps into one.
  const live = new Set();  // the interference's streams, aborted at its end
  const stream = async (r, temperature, onToken, abortable = false) => {
    const controller = abortable ? new AbortController() : null;
    if (controller) live.add(controller);
    const sent = performance.now();
    const times = [];
    let tokens = 0;
    try {
      const s = await client.completions.create(
        { model, prompt: r.prompt, max_tokens: r.max_tokens, temperature, seed: r.seed, logprobs: 0,
          stream: true, stream_options: { include_usage: true } },
        controller ? { signal: controller.signal } : {});
      for await (const chunk of s) {
        const n = chunk.choices[0]?.logprobs?.tokens?.length ?? 0;
        for (let k = 0; k < n; ++k) {
          times.push(performance.now());
          if (onToken) onToken(times[times.length - 1], times.length);
        }
        if (chunk.usage) tokens = chunk.usage.completion_tokens;
      }
    } catch (e) {
      if (!controller?.signal.aborted) throw e;
    } finally {
      if (controller) live.delete(controller);
    }
    return { sent, times, tokens: tokens || times.length };
  };
  const counted = (mix) => (r) => stream(r, mix.temperature);

  if (spec.warmup) {
    const w = spec.warmup;
    await closedLoop(w.clients, requests(w.mix, w.requests, 999), counted(w.mix));
  }

  if (spec.levels) {
    const { clients, requests: counts, mix } = spec.levels;
    for (let i = 0; i < clients.length; ++i) {
      const steps0 = await metric("cleave_steps_total");
      const r = await closedLoop(clients[i], requests(mix, counts[i], clients[i]), counted(mix));
      const steps = (await metric("cleave_steps_total")) - steps0;
      console.log(levelLine(clients[i], counts[i], r, Number.isFinite(steps) ? steps : "-"));
    }
  }

  if (spec.interference) {
    const { clients, prompt, long, cycles, before_ms: beforeMs, mix } = spec.interference;
    const u = random(mix.seed * 31 + 5);
    const arrivals = [];  // [end of a gap, its length] of the decoding streams
    let stop = false, started = 0;
    let ready;
    const allDecoding = new Promise((resolve) => (ready = resolve));
    const loops = Array.from({ length: clients }, async (_, c) => {
      let decoding = false;
      for (let i = 0; !stop; ++i) {
        let last = 0;
        const r = { prompt: randomIds(u, prompt, mix.vocab), max_tokens: mix.output[1], seed: 77 + c * 1000 + i };
        await stream(r, mix.temperature, (t, n) => {
          if (n > 1) arrivals.push([t, t - last]);
          last = t;
          if (n === 4 && !decoding) {
            decoding = true;
            if (++started === clients) ready();
          }
        }, true);
      }
    });
    await allDecoding;
    const before = [], during = [], ttft = [];
    let steps = 0;
    for (let k = 0; k < cycles; ++k) {
      await new Promise((resolve) => setTimeout(resolve, beforeMs));
      const steps0 = await metric("cleave_steps_total");
      const r = { prompt: randomIds(u, long, mix.vocab), max_tokens: 1, seed: 5 + k };
      const { sent, times } = await stream(r, mix.temperature);
      steps += (await metric("cleave_steps_total")) - steps0;
      ttft.push(times[0] - sent);
      for (const [t, gap] of arrivals) {
        if (t >= sent - beforeMs && t < sent) before.push(gap);
        else if (t >= sent && t <= times[0] + 5) during.push(gap);  // + the same step's tokens
      }
      arrivals.length = 0;
    }
    stop = true;
    for (const c of live) c.abort();
    await Promise.all(loops);
    console.log(`interference ${ms(quantile(before, 0.5))} ${ms(quantile(before, 0.99))} ` +
      `${ms(quantile(during, 0.5))} ${ms(quantile(during, 0.99))} ${ms(quantile(ttft, 0.5))} ${steps / cycles}`);
  }

  if (spec.prefix) {
    const { tokens, shared, pairs, mix } = spec.prefix;
    const u = random(mix.seed * 131 + 17);
    const cold = [], warm = [], reused = [];
    for (let k = 0; k < pairs; ++k) {
      const a = randomIds(u, tokens, mix.vocab);
      const b = a.slice(0, shared).concat(randomIds(u, tokens - shared, mix.vocab));
      const ra = await stream({ prompt: a, max_tokens: 1, seed: 1 }, mix.temperature);
      cold.push(ra.times[0] - ra.sent);
      const before = await metric("cleave_prefix_cached_tokens_total");
      const rb = await stream({ prompt: b, max_tokens: 1, seed: 1 }, mix.temperature);
      warm.push(rb.times[0] - rb.sent);
      reused.push((await metric("cleave_prefix_cached_tokens_total")) - before);
    }
    console.log(`prefix ${ms(quantile(cold, 0.5))} ${ms(quantile(warm, 0.5))} ${quantile(reused, 0.5)}`);
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(path.resolve(process.argv[1])).href) await main();
