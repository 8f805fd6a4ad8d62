/**
 * The Vercel AI SDK integration against the live server (MEMORIA_SERVER, started by
 * scripts/test-clients.sh), with the SDK's own test model, MockLanguageModelV3 (ai/test): it
 * asks for memory_rewrite, reads the tool result, and answers, once through generateText and
 * once through streamText. What the model must read comes from the cross-language conformance
 * data (tests/conformance/model_turn.json); the test checks the system prompt the model got,
 * the tool result, the finished turn sent by the middleware, the saved block, and what
 * GetTurnInspection recorded for the turn.
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import type {
  LanguageModelV3CallOptions,
  LanguageModelV3Content,
  LanguageModelV3StreamPart,
} from "@ai-sdk/provider";
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { MemoriaAdapter, NoTurnError } from "@memoria/client";
import { generateText, simulateReadableStream, stepCountIs, streamText, wrapLanguageModel } from "ai";
import { MockLanguageModelV3 } from "ai/test";

import { ConversationSearchService } from "../gen/memoria/v1/conversation_search_service_pb.js";
import { Writer } from "../gen/memoria/v1/memory_block_pb.js";
import { MemoryBlockService } from "../gen/memoria/v1/memory_block_service_pb.js";
import { memoriaMiddleware, memoriaTools } from "../src/index.js";

const server = process.env.MEMORIA_SERVER;
if (!server) throw new Error("MEMORIA_SERVER is not set: scripts/test-clients.sh starts the server and sets it");

interface Step {
  name: string;
  turn: [string, string];
  arguments: { text: string };
  expect: { text: string; after_instructions: string };
}
const steps = (
  JSON.parse(readFileSync(new URL("../../../../tests/conformance/model_turn.json", import.meta.url), "utf8")) as {
    steps: Step[];
  }
).steps;
const step = (name: string) => steps.find((s) => s.name === name)!;
const write = step("saved: two lines added");
const emptyBlockLine = step("a first turn's section: nothing remembered yet").expect.after_instructions;
const [conversationId, turnId] = write.turn;
const BASE = "You are a helpful assistant."; // the system prompt of the README wiring
const QUESTION = "Call me Ana, and my Jira account is acct-7731.";
const ANSWER = "Noted, Ana.";

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};

/** What the model was given on one call: the system prompt and the tool results' outputs. */
function seen(options: LanguageModelV3CallOptions) {
  const system = options.prompt.filter((m) => m.role === "system").map((m) => m.content);
  const results = options.prompt.flatMap((m) => (m.role === "tool" ? m.content : []));
  const outputs = results.map((part) => (part.type === "tool-result" ? part.output : undefined));
  return { system, outputs };
}

/** The model's reply to a call: the rewrite first, the answer once it has read a result. */
function reply(options: LanguageModelV3CallOptions): LanguageModelV3Content[] {
  if (seen(options).outputs.length === 0) {
    const input = JSON.stringify(write.arguments);
    return [{ type: "tool-call", toolCallId: "call-1", toolName: "memory_rewrite", input }];
  }
  return [{ type: "text", text: ANSWER }];
}

/** A fresh person's adapter on a transport that records each call's method and request. */
async function person() {
  const calls: { method: string; message: Record<string, unknown> }[] = [];
  const record: Interceptor = (next) => async (request) => {
    calls.push({ method: request.method.name, message: request.message as Record<string, unknown> });
    return next(request);
  };
  const transport = createGrpcTransport({ baseUrl: `http://${server}`, interceptors: [record] });
  const identity = { "x-memoria-tenant": `vercel-ai-${randomUUID().slice(0, 12)}`, "x-memoria-principal": "ana" };
  const memory = await MemoriaAdapter.connect(transport, identity, { timeoutMs: 60_000 });
  return { memory, transport, identity, calls };
}

/** What each model call saw, and what the server recorded for the turn. */
async function checkTurn(
  { memory, transport, identity, calls }: Awaited<ReturnType<typeof person>>,
  modelCalls: LanguageModelV3CallOptions[],
) {
  const [first, second] = modelCalls.map(seen);
  assert.equal(modelCalls.length, 2);
  assert.equal(first.system.length, 1);
  assert.ok(first.system[0].startsWith(`${BASE}\n\n`), first.system[0]);
  assert.ok(first.system[0].endsWith(emptyBlockLine), first.system[0]);
  assert.deepEqual(second.outputs, [{ type: "text", value: write.expect.text }]);
  assert.ok(second.system[0].endsWith(write.arguments.text), "the second call sees the saved block");

  // The middleware finished the turn: one IndexTurn with the question and answer, accepted.
  assert.equal(await memory.flush(), 0);
  const indexed = calls.filter((c) => c.method === "IndexTurn").map((c) => c.message);
  assert.deepEqual(
    indexed.map(({ conversationId, turnId, question, answer }) => ({ conversationId, turnId, question, answer })),
    [{ conversationId, turnId, question: QUESTION, answer: ANSWER }],
  );
  await assert.rejects(memory.promptSection(), NoTurnError);

  const options = { headers: identity, timeoutMs: 60_000 };
  const stored = await createClient(MemoryBlockService, transport).getMemoryBlock({}, options);
  assert.equal(stored.memoryBlock?.text, write.arguments.text);
  const { inspection } = await createClient(ConversationSearchService, transport).getTurnInspection(
    { turn: { conversationId, turnId } },
    options,
  );
  assert.equal(inspection?.renders.length, 2);
  assert.equal(inspection?.renders[0].charCount, 0);
  assert.deepEqual(
    inspection?.writes.map((w) => ({ writer: w.writer, removed: w.removedLines, added: w.addedLines })),
    [{ writer: Writer.MODEL, removed: [], added: write.arguments.text.split("\n") }],
  );
  assert.equal(inspection?.failedWriteCount, 0);
}

test("generateText: the model saves the block and reads the server's words", async () => {
  const p = await person();
  const llm = new MockLanguageModelV3({
    doGenerate: async (options) => ({
      content: reply(options),
      finishReason: { unified: reply(options)[0].type === "tool-call" ? "tool-calls" : "stop", raw: undefined },
      usage,
      warnings: [],
    }),
  });
  const memory = p.memory;
  const question = QUESTION;
  // README wiring: begin
  const model = wrapLanguageModel({ model: llm, middleware: memoriaMiddleware(memory) });
  memory.startTurn(conversationId, turnId);
  const { text } = await generateText({
    model,
    system: "You are a helpful assistant.",
    prompt: question,
    tools: memoriaTools(memory),
    stopWhen: stepCountIs(5),
  });
  // README wiring: end
  assert.equal(text, ANSWER);
  await checkTurn(p, llm.doGenerateCalls);
});

test("streamText: the same turn, streamed", async () => {
  const p = await person();
  const llm = new MockLanguageModelV3({
    doStream: async (options) => {
      const [first] = reply(options);
      const parts: LanguageModelV3StreamPart[] =
        first.type === "text"
          ? [
              { type: "text-start", id: "t" },
              { type: "text-delta", id: "t", delta: ANSWER.slice(0, 5) },
              { type: "text-delta", id: "t", delta: ANSWER.slice(5) },
              { type: "text-end", id: "t" },
            ]
          : [first as LanguageModelV3StreamPart];
      const finishReason = { unified: first.type === "text" ? "stop" : "tool-calls", raw: undefined } as const;
      return { stream: simulateReadableStream({ chunks: [...parts, { type: "finish", finishReason, usage }] }) };
    },
  });
  const memory = p.memory;
  const model = wrapLanguageModel({ model: llm, middleware: memoriaMiddleware(memory) });
  memory.startTurn(conversationId, turnId);
  const result = streamText({ model, system: BASE, prompt: QUESTION, tools: memoriaTools(memory), stopWhen: stepCountIs(5) });
  assert.equal(await result.text, ANSWER);
  await checkTurn(p, llm.doStreamCalls);
});
