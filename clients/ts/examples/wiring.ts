/**
 * The TypeScript wiring of clients/ts/README.md, run against a real server with a scripted
 * model in place of the OpenAI SDK (no network): the model saves a line, reads the server's
 * words, and answers; the program then checks what the model read and that GetTurnInspection
 * shows the turn's render and write, and exits non-zero when anything differs.
 *
 *     cd clients/ts && npm run build && MEMORIA_SERVER=127.0.0.1:50051 npm run example
 *
 * scripts/test-clients.sh runs it against its server, and tests/unit/test_client_readme.py
 * checks that the README shows exactly the lines between the two "README wiring" markers.
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";

import { createClient } from "@connectrpc/connect";

import { ConversationSearchService } from "../gen/memoria/v1/conversation_search_service_pb.js";

/** A chat message as the OpenAI SDK's Chat Completions API holds it. */
interface Message {
  role: string;
  content?: string | null;
  tool_call_id?: string;
  tool_calls?: { id: string; type: "function"; function: { name: string; arguments: string } }[];
}

/** The part of the OpenAI SDK's client the loop uses (`new OpenAI()` has this shape). */
interface ChatModel {
  chat: {
    completions: {
      create(request: { model: string; messages: Message[]; tools: object[] }): Promise<{ choices: { message: Message }[] }>;
    };
  };
}

// README wiring: begin
import { createGrpcTransport } from "@connectrpc/connect-node";
import { MemoriaAdapter } from "@memoria/client";

export async function connect(server: string, tenant: string, principal: string): Promise<MemoriaAdapter> {
  const transport = createGrpcTransport({ baseUrl: `http://${server}` });
  return MemoriaAdapter.connect(transport, { "x-memoria-tenant": tenant, "x-memoria-principal": principal });
}

export async function answer(memory: MemoriaAdapter, llm: ChatModel, conversationId: string, turnId: string, question: string) {
  memory.startTurn(conversationId, turnId);
  const system = "You are a helpful assistant.\n\n" + (await memory.promptSection());
  const messages: Message[] = [{ role: "system", content: system }, { role: "user", content: question }];
  const tools = memory.tools("openai_chat_completions");
  for (;;) {
    const reply = (await llm.chat.completions.create({ model: "your-model", messages, tools })).choices[0].message;
    messages.push(reply);
    if (!reply.tool_calls?.length) {
      memory.finishTurn(question, reply.content ?? "");
      return reply.content ?? "";
    }
    for (const call of reply.tool_calls) {
      const result = await memory.executeToolCall(call.function.name, call.function.arguments);
      messages.push({ role: "tool", tool_call_id: call.id, content: result.text });
    }
  }
}
// README wiring: end

/** Plays the model: it saves the person's name, then answers. */
class Scripted implements ChatModel {
  system = "";
  toolResult = "";
  toolCount = 0;
  chat = {
    completions: {
      create: async (request: { messages: Message[]; tools: object[] }) => {
        const last = request.messages[request.messages.length - 1];
        if (last.role === "user") {
          this.system = request.messages[0].content ?? "";
          this.toolCount = request.tools.length;
          const call = { name: "memory_rewrite", arguments: JSON.stringify({ text: "Preferred name: Ana" }) };
          return { choices: [{ message: { role: "assistant", tool_calls: [{ id: "call_1", type: "function" as const, function: call }] } }] };
        }
        this.toolResult = last.content ?? "";
        return { choices: [{ message: { role: "assistant", content: "Noted, Ana." } }] };
      },
    },
  };
}

const server = process.env.MEMORIA_SERVER || process.env.MEMORIA_ADDR || "127.0.0.1:50051";
const tenant = `wiring-ts-${randomUUID().slice(0, 8)}`;
const memory = await connect(server, tenant, "ana");
const model = new Scripted();
const reply = await answer(memory, model, "conv-1", "1", "Call me Ana.");
assert.equal(await memory.flush(), 0, "finished turns not accepted");
assert.equal(reply, "Noted, Ana.");
assert.equal(model.toolCount, 2);
assert.ok(model.system.endsWith("Personal memory: empty (nothing is remembered about this person yet)."), model.system);
assert.ok(model.toolResult.startsWith("Saved.") && model.toolResult.includes("\n+ Preferred name: Ana\n"), model.toolResult);
const search = createClient(ConversationSearchService, createGrpcTransport({ baseUrl: `http://${server}` }));
const { inspection } = await search.getTurnInspection(
  { turn: { conversationId: "conv-1", turnId: "1" } },
  { headers: { "x-memoria-tenant": tenant, "x-memoria-principal": "ana" } },
);
assert.equal(inspection?.renders.length, 1);
assert.deepStrictEqual(inspection?.writes.map((w) => w.addedLines), [["Preferred name: Ana"]]);
console.log("ok TypeScript wiring: the model saved a line, read the server's words and answered; the turn shows its render and write");
