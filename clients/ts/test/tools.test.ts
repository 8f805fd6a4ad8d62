/**
 * The model's tools (tools/*.json, rendered from tools/memoria_tools.json) as a TypeScript
 * agent loads them: the three provider shapes name the same two tools with the same
 * parameters, and a tool call given as the JSON arguments string a provider hands over runs
 * against the live server (MEMORIA_SERVER) as the RPC it stands for.
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";

import { timestampNow } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import { ConversationSearchService } from "../gen/memoria/v1/conversation_search_service_pb.js";
import { Writer } from "../gen/memoria/v1/memory_block_pb.js";
import { MemoryBlockService } from "../gen/memoria/v1/memory_block_service_pb.js";

const addr = process.env.MEMORIA_SERVER || process.env.MEMORIA_ADDR;
if (!addr) throw new Error("MEMORIA_SERVER is not set: scripts/test-clients.sh starts the server and sets it");
const transport = createGrpcTransport({ baseUrl: `http://${addr}` });
const blocks = createClient(MemoryBlockService, transport);
const search = createClient(ConversationSearchService, transport);
const me = {
  headers: { "x-memoria-tenant": `ts-tools-${randomUUID().slice(0, 8)}`, "x-memoria-principal": "ana" },
};

interface Schema {
  type: string;
  properties: Record<string, Record<string, unknown>>;
  required: string[];
  additionalProperties: boolean;
}
interface Tool {
  description: string;
  parameters: Schema;
}

/** tools/<file> as name -> tool, whichever provider shape it is in. */
function loadTools(file: string): Map<string, Tool> {
  const entries = JSON.parse(
    readFileSync(new URL(`../../../../tools/${file}`, import.meta.url), "utf8"),
  ) as Record<string, any>[];
  const tools = new Map<string, Tool>();
  for (const entry of entries) {
    // Chat Completions nests the function; Responses is flat; Anthropic calls it input_schema.
    const t = entry.type === "function" && entry.function ? entry.function : entry;
    const parameters = (t.parameters ?? t.input_schema) as Schema | undefined;
    assert.ok(typeof t.name === "string" && typeof t.description === "string" && parameters, file);
    tools.set(t.name, { description: t.description, parameters });
  }
  return tools;
}

/** A tool call's arguments string, checked against the tool's schema as a careful agent does. */
function parseArguments(tool: Tool, argumentsJson: string): Record<string, unknown> {
  const args = JSON.parse(argumentsJson) as Record<string, unknown>;
  for (const name of Object.keys(args)) {
    if (!(name in tool.parameters.properties)) throw new Error(`unknown argument ${name}`);
  }
  for (const name of tool.parameters.required) {
    if (!(name in args)) throw new Error(`missing argument ${name}`);
  }
  return args;
}

describe("tool definitions", () => {
  const chat = loadTools("openai_chat_completions.json");

  test("the three provider files agree and declare the agreed arguments", () => {
    assert.deepEqual(loadTools("openai_responses.json"), chat);
    assert.deepEqual(loadTools("anthropic_messages.json"), chat);
    assert.deepEqual([...chat.keys()].sort(), ["conversation_search", "memory_rewrite"]);
    const rewrite = chat.get("memory_rewrite")!.parameters;
    assert.deepEqual(Object.keys(rewrite.properties), ["text"]);
    assert.deepEqual(rewrite.required, ["text"]);
    assert.equal(rewrite.additionalProperties, false);
    const searchTool = chat.get("conversation_search")!.parameters;
    assert.deepEqual(Object.keys(searchTool.properties).sort(), [
      "conversation_id",
      "end_time",
      "max_turns",
      "query",
      "start_time",
    ]);
    assert.deepEqual(searchTool.required, ["query"]);
    assert.equal(searchTool.additionalProperties, false);
    assert.equal(searchTool.properties.max_turns.type, "integer");
    assert.equal(searchTool.properties.max_turns.minimum, 1);
    assert.equal(searchTool.properties.max_turns.maximum, 50);
    for (const bound of ["start_time", "end_time"]) {
      assert.equal(searchTool.properties[bound].type, "string");
      assert.ok(new RegExp(String(searchTool.properties[bound].pattern)).test("2026-03-01T09:00:00Z"));
    }
  });

  test("a conversation_search call finds a turn indexed before it", async () => {
    const token = `acct-${Math.floor(100000 + Math.random() * 900000)}`;
    const conversationId = `c-${randomUUID()}`;
    await search.indexTurn(
      {
        conversationId,
        turnId: "t1",
        question: "Where did the refund go?",
        answer: `It went to ${token}.`,
        turnTime: timestampNow(),
        wait: true,
      },
      me,
    );
    const args = parseArguments(
      chat.get("conversation_search")!,
      JSON.stringify({ query: token, max_turns: 2 }),
    );
    const found = await search.searchConversations(
      { query: String(args.query), pageSize: Number(args.max_turns) },
      me,
    );
    assert.ok(found.hits.length >= 1 && found.hits.length <= 2, `${found.hits.length} hits`);
    assert.equal(found.hits[0].conversationId, conversationId);
    assert.ok(found.hits[0].text.includes(token));
    assert.throws(() => parseArguments(chat.get("conversation_search")!, '{"max_turns": 2}'));
  });

  test("a memory_rewrite call saves the whole block and reports the added lines", async () => {
    const args = parseArguments(
      chat.get("memory_rewrite")!,
      JSON.stringify({ text: "Preferred name: Ana\nLikes short answers" }),
    );
    const saved = await blocks.rewriteMemoryBlock({ text: String(args.text), writer: Writer.MODEL }, me);
    assert.deepEqual(saved.addedLines, ["Preferred name: Ana", "Likes short answers"]);
    assert.deepEqual(saved.removedLines, []);
    assert.throws(() => parseArguments(chat.get("memory_rewrite")!, '{"text": "x", "append": true}'));
  });
});
