// The official `openai` Node.js client (pinned in package.json / package-lock.json) against
// `heavykv serve --http-address`: a completion and a chat completion, streamed and not, and the
// text equals gRPC's for the same greedy request (`heavykv generate`, a gRPC client). The chat
// needs ../shared/gguf/qwen-vocab.gguf for a ChatML model and is skipped without it; its text is
// compared between the client's stream and its non-streamed call (tests/server/openai_e2e_test.cc ties
// the HTTP chat to gRPC's Chat). With `tools` and tool_choice "required" the random model's output
// is a call (the grammar holds it) that the client reads whole and gathers from the stream.
//
//   HEAVYKV_BINARY=build/bin/heavykv HEAVYKV_SOURCE_DIR=. node --test client_test.mjs
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";

const binary = process.env.HEAVYKV_BINARY;
const source = process.env.HEAVYKV_SOURCE_DIR;
assert.ok(binary && source, "set HEAVYKV_BINARY and HEAVYKV_SOURCE_DIR");
const dir = mkdtempSync(join(tmpdir(), "heavykv-node-"));
const servers = [];

// `heavykv serve ARGS` on loopback ports: {grpc, http, client}.
async function serve(args) {
  const proc = spawn(binary, ["serve", "--listen", "127.0.0.1:0", "--metrics-address", "",
                              "--http-address", "127.0.0.1:0", "--threads", "1", ...args]);
  servers.push(proc);
  let log = "";
  return await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`serve did not start:\n${log}`)), 30000);
    const onData = (chunk) => {
      log += chunk;
      const m = log.match(/gRPC listening on 127\.0\.0\.1:(\d+);.*OpenAI HTTP on 127\.0\.0\.1:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve({
          grpc: Number(m[1]),
          http: Number(m[2]),
          client: new OpenAI({ baseURL: `http://127.0.0.1:${m[2]}/v1`, apiKey: "unused",
                               maxRetries: 0 }),
        });
      }
    };
    proc.stdout.on("data", onData);
    proc.stderr.on("data", onData);
    proc.on("exit", (code) => reject(new Error(`serve exited ${code}:\n${log}`)));
  });
}

let stories, chat, llama, llama31;
before(async () => {
  stories = await serve(["--model", join(source, "models/stories260K.bin"),
                         "--tokenizer", join(source, "models/tok512.bin"),
                         "--served-model-name", "stories"]);
  const vocab = join(source, "../shared/gguf/qwen-vocab.gguf");
  if (existsSync(vocab)) {
    const model = join(dir, "chat.gguf");
    execFileSync(binary, ["make-model", "--format", "gguf", "--arch", "qwen2", "--dim", "64",
                          "--hidden-dim", "128", "--layers", "2", "--heads", "4", "--kv-heads",
                          "2", "--seq-len", "512", "--vocab-from", vocab, "--out", model]);
    chat = await serve(["--model", model]);
  }
  const llamaVocab = join(source, "../shared/gguf/llama3-vocab.gguf");
  if (existsSync(llamaVocab)) {
    const model = join(dir, "llama.gguf");
    execFileSync(binary, ["make-model", "--format", "gguf", "--arch", "llama", "--dim", "64",
                          "--hidden-dim", "128", "--layers", "2", "--heads", "4", "--kv-heads",
                          "2", "--seq-len", "512", "--vocab-from", llamaVocab, "--out", model]);
    llama = await serve(["--model", model]);
    // The same model under Llama 3.1's template: its tool calls are bare {"name", "parameters"}.
    llama31 = await serve(["--model", model, "--chat-template",
                           join(source, "tests/data/chat_templates/llama3.1.jinja")]);
  }
});
after(() => {
  for (const proc of servers) proc.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
});

// What gRPC's Generate returns for the same greedy request.
function grpcText(port, prompt, maxTokens) {
  const out = execFileSync(binary, ["generate", "--server", `127.0.0.1:${port}`, "--temperature",
                                    "0", "--max-tokens", String(maxTokens), "--json", prompt]);
  return JSON.parse(out.toString()).text;
}

test("completion, streamed and not, equals gRPC's text", async () => {
  const expected = grpcText(stories.grpc, "Once upon a time", 40);
  assert.ok(expected.length > 0);
  const request = { model: "stories", prompt: "Once upon a time", max_tokens: 40,
                    temperature: 0 };
  const whole = await stories.client.completions.create(request);
  assert.equal(whole.object, "text_completion");
  assert.equal(whole.choices[0].text, expected);
  assert.equal(whole.choices[0].finish_reason, "length");
  assert.equal(whole.usage.completion_tokens, 40);

  const stream = await stories.client.completions.create({
    ...request, stream: true, stream_options: { include_usage: true } });
  let text = "";
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    ++chunks;
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) text += choice.text;
  }
  // Deltas ready together go out as one chunk (as gRPC merges them): on a busy machine all 40
  // tokens may come in one; the usage chunk follows.
  assert.ok(chunks >= 2, `${chunks} chunks`);
  assert.equal(text, expected);
  assert.equal(usage.completion_tokens, 40);
  assert.equal(usage.total_tokens, usage.prompt_tokens + 40);
});

test("models and errors as the client reads them", async () => {
  const models = await stories.client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ["stories"]);
  const model = await stories.client.models.retrieve("stories");  // GET /v1/models/{id}
  assert.equal(model.id, "stories");
  assert.equal(model.object, "model");
  await assert.rejects(
    stories.client.models.retrieve("other"),
    (err) => err instanceof OpenAI.NotFoundError && err.code === "model_not_found");
  await assert.rejects(  // over serve --max-n
    stories.client.completions.create({ model: "stories", prompt: "x", n: 99 }),
    (err) => err instanceof OpenAI.BadRequestError && err.status === 400 && err.param === "n");
  const several = await stories.client.completions.create(
    { model: "stories", prompt: "Once", n: 2, max_tokens: 4 });
  assert.deepEqual(several.choices.map((c) => c.index), [0, 1]);
  await assert.rejects(
    stories.client.completions.create({ model: "other", prompt: "x" }),
    (err) => err instanceof OpenAI.NotFoundError && err.code === "model_not_found");
  await assert.rejects(  // no chat template
    stories.client.chat.completions.create({
      model: "stories", messages: [{ role: "user", content: "hi" }] }),
    (err) => err instanceof OpenAI.BadRequestError && /chat template/.test(err.message));
});

test("chat completion: the stream starts with the role and equals the whole answer",
     async (t) => {
  if (!chat) return t.skip("../shared/gguf/qwen-vocab.gguf is absent");
  const request = { model: "chat.gguf", messages: [{ role: "user", content: "Hello there" }],
                    max_tokens: 24, temperature: 0, ignore_eos: true };
  const whole = await chat.client.chat.completions.create(request);
  assert.equal(whole.object, "chat.completion");
  assert.equal(whole.choices[0].message.role, "assistant");
  assert.equal(whole.usage.completion_tokens, 24);

  const stream = await chat.client.chat.completions.create({ ...request, stream: true });
  let text = "";
  let first = true;
  let finish = null;
  for await (const chunk of stream) {
    const delta = chunk.choices[0].delta;
    if (first) assert.equal(delta.role, "assistant");
    first = false;
    text += delta.content ?? "";
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, "length");
});

// Structured outputs (issue 43): a JSON schema holds a random model's greedy answer to JSON that
// parses and validates, on the Qwen3 and Llama 3 vocabularies; a constrained answer is the same
// alone and in a batch of 16 mixed (8 constrained, 8 free) requests.
const personSchema = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 12 },
    age: { type: "integer", minimum: 0, maximum: 120 },
    tags: { type: "array", items: { enum: ["red", "green", "blue"] }, maxItems: 3 },
  },
  required: ["name", "age", "tags"],
  additionalProperties: false,
};
function checkPerson(text) {
  const p = JSON.parse(text);
  assert.deepEqual(Object.keys(p).sort(), ["age", "name", "tags"]);
  assert.equal(typeof p.name, "string");
  assert.ok([...p.name].length <= 12, p.name);
  assert.ok(Number.isInteger(p.age) && p.age >= 0 && p.age <= 120, String(p.age));
  assert.ok(Array.isArray(p.tags) && p.tags.length <= 3);
  for (const t of p.tags) assert.ok(["red", "green", "blue"].includes(t), t);
}

for (const [name, server, model] of [["Qwen3", () => chat, "chat.gguf"],
                                     ["Llama 3", () => llama, "llama.gguf"]]) {
  test(`response_format json_schema on the ${name} vocabulary: parses, validates, batch-invariant`,
       async (t) => {
    if (!server()) return t.skip(`../shared/gguf has no ${name} vocabulary`);
    const client = server().client;
    const request = (i, constrained) => ({
      model, max_tokens: constrained ? 200 : 24, temperature: 0,
      messages: [{ role: "user", content: `Describe person number ${i} as JSON.` }],
      chat_template_kwargs: { enable_thinking: false },
      ...(constrained ? { response_format: { type: "json_schema",
                                               json_schema: { name: "person", strict: true,
                                                              schema: personSchema } } } : {}),
    });
    const alone = [];
    for (let i = 0; i < 8; ++i) {
      const r = await client.chat.completions.create(request(i, true));
      assert.equal(r.choices[0].finish_reason, "stop", r.choices[0].message.content);
      checkPerson(r.choices[0].message.content);
      alone.push(r.choices[0].message.content);
    }
    const batch = await Promise.all([...Array(16).keys()].map(
        (k) => client.chat.completions.create(request(k >> 1, k % 2 === 0))));
    for (let k = 0; k < 16; k += 2) assert.equal(batch[k].choices[0].message.content, alone[k >> 1]);

    // json_object: any JSON object; streamed, the chunks join to it.
    const stream = await client.chat.completions.create({
      ...request(0, false), max_tokens: 200, stream: true,
      response_format: { type: "json_object" } });
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
    const parsed = JSON.parse(text);
    assert.equal(typeof parsed, "object");
    assert.ok(!Array.isArray(parsed) && parsed !== null);

    // A schema that does not compile is a 400 naming the field and the keyword's path.
    await assert.rejects(
      client.chat.completions.create({ ...request(0, false), response_format: {
        type: "json_schema", json_schema: { name: "x", schema: {
          type: "object", properties: { a: { type: "string", pattern: "(a)\\1" } } } } } }),
      (err) => err instanceof OpenAI.BadRequestError && err.param === "response_format" &&
               /properties\/a\/pattern/.test(err.message));
  });
}

for (const [name, server, model] of [["Qwen3", () => chat, "chat.gguf"],
                                     ["Llama 3", () => llama, "llama.gguf"],
                                     ["Llama 3 (3.1 template)", () => llama31, "llama.gguf"]]) {
test(`tools on the ${name} vocabulary: tool_choice required is a call whose arguments validate, streamed and not`,
     async (t) => {
  if (!server()) return t.skip(`../shared/gguf has no ${name} vocabulary`);
  const client = server().client;
  const tools = [{ type: "function", function: {
    name: "get_weather", description: "Get the current weather in a city.",
    parameters: { type: "object", properties: { city: { type: "string", enum: ["Paris", "Oslo"] } },
                  required: ["city"], additionalProperties: false } } }];
  const request = { model, messages: [{ role: "user", content: "Weather in Paris?" }],
                    tools, tool_choice: "required", parallel_tool_calls: false, max_tokens: 200,
                    temperature: 0, chat_template_kwargs: { enable_thinking: false } };
  const whole = await client.chat.completions.create(request);
  const message = whole.choices[0].message;
  assert.equal(whole.choices[0].finish_reason, "tool_calls");
  assert.equal(message.content, null);
  assert.equal(message.tool_calls.length, 1);
  const call = message.tool_calls[0];
  assert.equal(call.type, "function");
  assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
  assert.equal(call.function.name, "get_weather");
  assert.ok(["Paris", "Oslo"].includes(JSON.parse(call.function.arguments).city));

  // The client's stream helper gathers the tool-call deltas into the same call.
  const final = await client.chat.completions.stream(request).finalChatCompletion();
  assert.equal(final.choices[0].finish_reason, "tool_calls");
  const streamed = final.choices[0].message.tool_calls;
  assert.equal(streamed.length, 1);
  assert.equal(streamed[0].function.name, "get_weather");
  assert.deepEqual(JSON.parse(streamed[0].function.arguments), JSON.parse(call.function.arguments));
});
}
