// llama.cpp's side of bench/inference.sh and bench/serve.sh, through node-llama-cpp's prebuilt CPU
// build installed as tests/integration/node_llama_cpp/install.sh installs it (and driven as the
// GGUF test's llama_cpp.mjs drives it: never a build from source, never a download).
//   node llama_cpp_bench.mjs NPM_DIR GGUF THREADS SPEC_JSON
// SPEC_JSON: {"decode": {"prompt": "ID ...", "tokens": N},
//             "prefill": {"prompt": "ID ..."},
//             "batched": {"sequences": [N, ...], "prompt": "ID ...", "tokens": N},
//             "serve": {"clients": [C, ...], "requests": [R, ...], "mix": MIX, "context": N}}
// Each part is optional. "serve" is bench/serve.sh's (below); the others, bench/inference.sh's,
// each run once untimed first (the backend's first-use costs), as `cleave generate --warmup` does,
// then timed. Greedy, and the end-of-generation token does not stop a sequence (cleave's
// --prompt-ids runs have no stop token either). Timed as cleave times itself: prefill ends when
// the first new token is drawn; decode is the time from there to the last token, over the tokens
// after each sequence's first. Prints, one a line:
//   tokens <prompt ids> | <new ids>               (decode's continuation)
//   decode <tokens> <ms> <tokens/s>
//   prefill <prompt tokens> <ms> <tokens/s>
//   batched <sequences> <decoded tokens> <ms> <tokens/s>
// "serve": the request mix of bench/serve_load.mjs (MIX as there, the same requests for a level),
// served at each level by one context of C sequences of N tokens each, C clients each sending its
// next request to its own sequence as soon as its last ended; sampled at the mix's temperature with
// each request's seed; the end-of-generation token ends a request, as cleave's end-of-text token
// does. Timed as serve_load.mjs times cleave's streams (token times as the tokens are drawn, in
// process: no HTTP), and printed in its "level" line (steps "-"). Each context first decodes a short
// request on every sequence at once, untimed.
import path from "node:path";
import { performance } from "node:perf_hooks";
import { pathToFileURL } from "node:url";
import { closedLoop, levelLine, randomIds, random, requests } from "./serve_load.mjs";

const [npmDir, gguf, threadsArg, specJson] = process.argv.slice(2);
const threads = Number(threadsArg);
const spec = JSON.parse(specJson);
const entry = path.join(npmDir, "node_modules", "node-llama-cpp", "dist", "index.js");
const { getLlama } = await import(pathToFileURL(entry).href);
const ids = (s) => s.trim().split(/\s+/).filter((x) => x !== "").map(Number);
const rate = (n, ms) => (ms > 0 ? (1e3 * n) / ms : 0).toFixed(1);

const llama = await getLlama({ gpu: false, build: "never", skipDownload: true,
                               usePrebuiltBinaries: true, logLevel: "error",
                               maxThreads: threads });
const model = await llama.loadModel({ modelPath: gguf, gpuLayers: 0 });

// A context of `sequences` sequences of `size` tokens each (node-llama-cpp gives each sequence
// its own cells); batches of up to 512 tokens, its default, so that a 512-token prompt is one
// batch, as cleave prefills it whole.
const contextOf = (sequences, size) =>
  model.createContext({ sequences, contextSize: size, batchSize: 512, threads });

// One sequence's greedy continuation: its tokens and the times of its first and last.
async function greedy(sequence, prompt, tokens) {
  const out = [];
  let first = 0;
  for await (const token of sequence.evaluate(prompt, { temperature: 0, yieldEogToken: true })) {
    if (out.length === 0) first = performance.now();
    out.push(token);
    if (out.length >= tokens) break;
  }
  return { out, first, last: performance.now() };
}

// Each sequence continues the same prompt, all at once: node-llama-cpp gathers what every sequence
// queues in an event loop turn into one llama_decode batch, so each step decodes them together.
async function together(sequences, prompt, tokens) {
  const results = await Promise.all(sequences.map((s) => greedy(s, prompt, tokens)));
  await Promise.all(sequences.map((s) => s.clearHistory()));
  return results;
}

if (spec.decode) {
  const prompt = ids(spec.decode.prompt), n = spec.decode.tokens;
  const context = await contextOf(1, prompt.length + n);
  const sequence = context.getSequence();
  await greedy(sequence, prompt, 2);
  await sequence.clearHistory();
  const { out, first, last } = await greedy(sequence, prompt, n);
  console.log(`tokens ${prompt.join(" ")} | ${out.join(" ")}`);
  console.log(`decode ${out.length - 1} ${(last - first).toFixed(1)} ${rate(out.length - 1, last - first)}`);
  await context.dispose();
}

if (spec.prefill) {
  const prompt = ids(spec.prefill.prompt);
  const context = await contextOf(1, prompt.length + 2);
  const sequence = context.getSequence();
  await greedy(sequence, prompt, 1);
  await sequence.clearHistory();
  const start = performance.now();
  const { first } = await greedy(sequence, prompt, 1);
  console.log(`prefill ${prompt.length} ${(first - start).toFixed(1)} ${rate(prompt.length, first - start)}`);
  await context.dispose();
}

if (spec.batched) {
  const prompt = ids(spec.batched.prompt), n = spec.batched.tokens;
  for (const count of spec.batched.sequences) {
    const context = await contextOf(count, prompt.length + n);
    const sequences = Array.from({ length: count }, () => context.getSequence());
    await together(sequences, prompt, 2);
    const results = await together(sequences, prompt, n);
    const first = Math.min(...results.map((r) => r.first));
    const last = Math.max(...results.map((r) => r.last));
    const decoded = results.reduce((sum, r) => sum + r.out.length - 1, 0);
    console.log(`batched ${count} ${decoded} ${(last - first).toFixed(1)} ${rate(decoded, last - first)}`);
    await context.dispose();
  }
}

if (spec.serve) {
  const { clients, requests: counts, mix, context: size } = spec.serve;
  for (let i = 0; i < clients.length; ++i) {
    const context = await contextOf(clients[i], size);
    const sequences = Array.from({ length: clients[i] }, () => context.getSequence());
    const one = async (r, c) => {
      const sent = performance.now();
      const times = [];
      for await (const token of sequences[c].evaluate(r.prompt, { temperature: mix.temperature, seed: r.seed })) {
        times.push(performance.now());
        if (times.length >= r.max_tokens) break;
      }
      await sequences[c].clearHistory();
      return { sent, times, tokens: times.length };
    };
    const u = random(mix.seed + 3);
    const warm = sequences.map((_, c) => ({ prompt: randomIds(u, mix.prompt[0], mix.vocab), max_tokens: 4, seed: c }));
    await Promise.all(warm.map((r, c) => one(r, c)));
    const result = await closedLoop(clients[i], requests(mix, counts[i], clients[i]), one);
    console.log(levelLine(clients[i], counts[i], result));
    await context.dispose();
  }
}

await model.dispose();
await llama.dispose();
