/**
 * The scripted model turn, tests/conformance/model_turn.json, played through the TypeScript
 * adapter against the live server, as tests/conformance/adapter_turn.py plays it through the
 * Python one (its docstring says how each step is played): the tools in every shape, the
 * prompt section and each tool call's exact text through the adapter's API; the steps that are
 * not the model's side (IndexTurn with wait, UpdateMemorySettings, GetTurnInspection) through
 * the raw stubs. The server is MEMORIA_SERVER (or the older MEMORIA_ADDR).
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import { ConversationSearchService, IndexTurnOutcome } from "../gen/memoria/v1/conversation_search_service_pb.js";
import { Writer } from "../gen/memoria/v1/memory_block_pb.js";
import { MemoryBlockService } from "../gen/memoria/v1/memory_block_service_pb.js";
import { MemoriaAdapter, NoTurnError, type Shape } from "../src/index.js";

const server = process.env.MEMORIA_SERVER || process.env.MEMORIA_ADDR;
if (!server) throw new Error("MEMORIA_SERVER is not set: scripts/test-clients.sh starts the server and sets it");

interface Step {
  name: string;
  call: string;
  turn?: [string, string];
  tool_name?: string;
  arguments?: object;
  arguments_json?: string;
  identity?: string;
  omit_turn?: boolean;
  expect: Record<string, unknown>;
  conversation_id?: string;
  turn_id?: string;
  question?: string;
  answer?: string;
  turn_time?: string;
  memory_enabled?: boolean;
}

const repo = (path: string) => readFileSync(new URL(`../../../../${path}`, import.meta.url), "utf8");
const data = JSON.parse(repo("tests/conformance/model_turn.json")) as {
  tools_file: string;
  instructions_file: string;
  steps: Step[];
};
const source = (JSON.parse(repo(data.tools_file)) as { tools: unknown[] }).tools;
const instructions = repo(data.instructions_file).trim();
const SHAPES: Shape[] = ["openai_chat_completions", "openai_responses", "anthropic_messages"];

/** A provider shape's tools back as {name, description, parameters}, through JSON. */
function fromShape(tools: Record<string, unknown>[], shape: Shape): unknown[] {
  return (JSON.parse(JSON.stringify(tools)) as Record<string, unknown>[]).map((entry) => {
    const e = (shape === "openai_chat_completions" ? entry.function : entry) as Record<string, unknown>;
    const parameters = shape === "anthropic_messages" ? e.input_schema : e.parameters;
    return { name: e.name, description: e.description, parameters };
  });
}

test("the TypeScript adapter gives the model the scripted words", async () => {
  assert.ok(data.steps.length >= 30, `only ${data.steps.length} steps in the data`);
  const transport = createGrpcTransport({ baseUrl: `http://${server}` });
  const identity = { "x-memoria-tenant": `conformance-ts-${randomUUID().slice(0, 12)}`, "x-memoria-principal": "ana" };
  const adapter = await MemoriaAdapter.connect(transport, identity, { timeoutMs: 60_000 });
  const blocks = createClient(MemoryBlockService, transport);
  const search = createClient(ConversationSearchService, transport);
  const as = { headers: identity, timeoutMs: 60_000 };
  const mismatches: string[] = [];
  let current = "";
  const inTurn = (turn: [string, string]) => {
    if (turn.join("\n") !== current) {
      adapter.startTurn(...turn);
      current = turn.join("\n");
    }
  };
  for (const step of data.steps) {
    const check = (what: string, expected: unknown, actual: unknown) => {
      try {
        assert.deepStrictEqual(actual, expected);
      } catch {
        mismatches.push(`${step.name}: ${what}: expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`);
      }
    };
    switch (step.call) {
      case "GetModelTools":
        for (const shape of SHAPES) check(shape, source, fromShape(adapter.tools(shape), shape));
        break;
      case "RenderPromptSection":
        inTurn(step.turn!);
        check("prompt_section", `${instructions}\n\n${step.expect.after_instructions}`, await adapter.promptSection());
        break;
      case "ExecuteToolCall": {
        // JSON.stringify is compact with the data's key order, as the Python runner sends it.
        const args = step.arguments_json ?? JSON.stringify(step.arguments);
        if (step.omit_turn) {
          await assert.rejects(adapter.forIdentity(identity).executeToolCall(step.tool_name!, args), NoTurnError);
          break;
        }
        let runner = adapter;
        let expected = { text: step.expect.text, isError: step.expect.is_error };
        if (step.identity === "none") {
          runner = adapter.forIdentity({});
          runner.startTurn(...step.turn!);
          expected = { text: step.expect.localized_message, isError: true };
        } else {
          inTurn(step.turn!);
        }
        const result = await runner.executeToolCall(step.tool_name!, args);
        check("text", expected.text, result.text);
        check("is_error", expected.isError, result.isError);
        break;
      }
      case "IndexTurn": {
        const response = await search.indexTurn(
          {
            conversationId: step.conversation_id!,
            turnId: step.turn_id!,
            question: step.question!,
            answer: step.answer!,
            turnTime: timestampFromDate(new Date(step.turn_time!)),
            wait: true,
          },
          as,
        );
        check("outcome", IndexTurnOutcome[IndexTurnOutcome.INDEXED], IndexTurnOutcome[response.outcome]);
        break;
      }
      case "UpdateMemorySettings":
        await blocks.updateMemorySettings({ memoryEnabled: step.memory_enabled!, writer: Writer.USER }, as);
        break;
      case "GetTurnInspection": {
        const [conversationId, turnId] = step.turn!;
        const { inspection } = await search.getTurnInspection({ turn: { conversationId, turnId } }, as);
        const writes = (inspection?.writes ?? []).map((w) => ({ removed_lines: w.removedLines, added_lines: w.addedLines }));
        check("writes", step.expect.writes, writes);
        check("failed_write_count", step.expect.failed_write_count, inspection?.failedWriteCount);
        check("renders", step.expect.renders, inspection?.renders.length);
        check("searches", step.expect.searches, inspection?.searches.length);
        break;
      }
      default:
        throw new Error(`${step.name}: unknown call ${step.call}`);
    }
  }
  adapter.finishTurn("The last question.", "The last answer.");
  assert.equal(await adapter.flush(), 0, "finished turns not accepted");
  assert.throws(() => adapter.finishTurn("again", "again"), NoTurnError);
  assert.deepStrictEqual(mismatches, []);
});
