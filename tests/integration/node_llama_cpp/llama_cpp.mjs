// llama.cpp, through node-llama-cpp's prebuilt CPU build, on GGUF files cleave exported.
//   node llama_cpp.mjs NPM_DIR JOBS.jsonl
// Each line of JOBS.jsonl is a job {"gguf", "mode", "prompt" (token ids, space-separated),
// "out"}, its answer written to the file "out":
//   mode "greedy", with "tokens" N and "text": the greedy continuation of the prompt, N tokens or
//     up to an end-of-generation token (left out, as llama.cpp leaves it), as the line
//     "<prompt ids> | <new ids>" that `cleave generate --ids` prints; then a line of llama.cpp's
//     ids of the text.
//   mode "forced", with "continuation" (token ids): teacher forcing: for each token of the
//     continuation, a line "<llama.cpp's greedy token> <its probability> <the probability of the
//     continuation's token>" after the prompt and the continuation's tokens before it.
// One process runs every job: starting llama.cpp's backend is most of a job's time.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [npmDir, jobsFile] = process.argv.slice(2);
const entry = path.join(npmDir, "node_modules", "node-llama-cpp", "dist", "index.js");
const { getLlama } = await import(pathToFileURL(entry).href);
const ids = (s) => s.trim().split(/\s+/).filter((x) => x !== "").map(Number);

// The prebuilt CPU binary or nothing: never a build from source, never a download.
const llama = await getLlama({ gpu: false, build: "never", skipDownload: true,
                               usePrebuiltBinaries: true, logLevel: "error", maxThreads: 2 });
for (const line of fs.readFileSync(jobsFile, "utf8").split("\n").filter((l) => l.trim())) {
  const job = JSON.parse(line);
  const model = await llama.loadModel({ modelPath: job.gguf, gpuLayers: 0 });
  const context = await model.createContext({ contextSize: model.trainContextSize, threads: 2 });
  const sequence = context.getSequence();
  const prompt = ids(job.prompt);
  const lines = [];
  if (job.mode === "greedy") {
    const out = [];
    for await (const token of sequence.evaluate(prompt, { temperature: 0 })) {
      out.push(token);
      if (out.length >= job.tokens) break;
    }
    lines.push(`${prompt.join(" ")} | ${out.join(" ")}`, model.tokenize(job.text).join(" "));
  } else if (job.mode === "forced") {
    const all = prompt.concat(ids(job.continuation));
    const asked = { generateNext: { token: true, probabilities: true,
                                    options: { temperature: 0 } } };
    const input = all.map((t, i) => (i >= prompt.length - 1 && i < all.length - 1 ? [t, asked] : t));
    const results = await sequence.controlledEvaluate(input);
    for (let i = prompt.length - 1; i < all.length - 1; ++i) {
      const next = results[i].next;
      lines.push(`${next.token} ${next.probabilities.get(next.token)} ` +
                 `${next.probabilities.get(all[i + 1]) ?? 0}`);
    }
  } else {
    throw new Error(`${job.gguf}: unknown mode ${job.mode}: greedy or forced`);
  }
  fs.writeFileSync(job.out, lines.join("\n") + "\n");
  await context.dispose();
  await model.dispose();
}
await llama.dispose();
