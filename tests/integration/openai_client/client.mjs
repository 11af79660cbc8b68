// The official OpenAI client against `cleave serve` (serve_openai_test.sh), unchanged: a
// completion, a streamed completion, a chat completion whole and streamed, log-probabilities, the
// model list, and errors surfacing as the client's typed exceptions with their status.
//   node client.mjs NPM_DIR BASE_URL KEY MODEL
import { createRequire } from "node:module";
import path from "node:path";

const [npmDir, baseURL, apiKey, model] = process.argv.slice(2);
const require = createRequire(path.join(npmDir, "package.json"));
const OpenAI = require("openai").default ?? require("openai");

const client = new OpenAI({ baseURL: baseURL + "/v1", apiKey, maxRetries: 0 });
const fail = (msg) => {
  console.log("FAIL: " + msg);
  process.exit(1);
};

const models = await client.models.list();
if (models.data[0].id !== model) fail("models.list: " + JSON.stringify(models.data));

const done = await client.completions.create({ model, prompt: "The king", max_tokens: 16, temperature: 0 });
const text = done.choices[0].text;
if (!text || done.usage.completion_tokens < 1) fail("completion: " + JSON.stringify(done));

let streamed = "";
let usage = null;
const stream = await client.completions.create({
  model, prompt: "The king", max_tokens: 16, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  if (chunk.choices.length) streamed += chunk.choices[0].text;
  if (chunk.usage) usage = chunk.usage;
}
if (streamed !== text) fail(`streamed ${JSON.stringify(streamed)} is not ${JSON.stringify(text)}`);
if (!usage || usage.completion_tokens !== done.usage.completion_tokens) fail("stream usage: " + JSON.stringify(usage));

const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "Who is the king?" }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 2 });
const said = chat.choices[0].message.content;
if (chat.choices[0].message.role !== "assistant" || chat.choices[0].logprobs.content.length !== chat.usage.completion_tokens)
  fail("chat: " + JSON.stringify(chat));
let pieces = "";
for await (const chunk of await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0, stream: true }))
  if (chunk.choices.length) pieces += chunk.choices[0].delta.content ?? "";
if (pieces !== said) fail(`streamed chat ${JSON.stringify(pieces)} is not ${JSON.stringify(said)}`);

// Errors come back as the client's exceptions, with the status and the field.
const expectError = async (name, status, param, call) => {
  try {
    await call();
  } catch (e) {
    if (e.status !== status || (param && e.param !== param)) fail(`${name}: ${e.status} ${e.param} ${e.message}`);
    return;
  }
  fail(name + ": no error");
};
await expectError("negative temperature", 400, "temperature", () =>
  client.completions.create({ model, prompt: "a", temperature: -1 }));
await expectError("n = 2", 400, "n", () => client.completions.create({ model, prompt: "a", n: 2 }));
await expectError("another model", 404, null, () => client.completions.create({ model: "gpt-4o", prompt: "a" }));
await expectError("a wrong key", 401, null, () =>
  new OpenAI({ baseURL: baseURL + "/v1", apiKey: "wrong", maxRetries: 0 }).models.list());
console.log(`openai client: models, completions (whole and streamed), chat (whole, streamed, logprobs), errors: ok; "${text}"`);
