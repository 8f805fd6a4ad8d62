/**
 * Memoria from TypeScript with the generated stubs: render the memory section, rewrite the
 * block, index a finished turn (waiting until it is searchable), search for it, and read an
 * error's google.rpc details.
 *
 *   cd examples/ts && npm ci && MEMORIA_SERVER=127.0.0.1:50051 npm start
 *
 * The server must trust the x-memoria-* headers (`memoria serve` on loopback does); with a
 * Memoria in jwt mode send { authorization: "Bearer <jwt>" } instead. scripts/test-clients.sh
 * runs this file against its server, so it stays correct.
 */
import { randomUUID } from "node:crypto";

import { timestampNow } from "@bufbuild/protobuf/wkt";
import { ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import { ErrorInfoSchema } from "../gen/google/rpc/error_details_pb.js";
import {
  ConversationSearchService,
  IndexTurnOutcome,
} from "../gen/memoria/v1/conversation_search_service_pb.js";
import { Writer } from "../gen/memoria/v1/memory_block_pb.js";
import { MemoryBlockService } from "../gen/memoria/v1/memory_block_service_pb.js";

const transport = createGrpcTransport({
  baseUrl: `http://${process.env.MEMORIA_SERVER ?? "127.0.0.1:50051"}`,
});
const blocks = createClient(MemoryBlockService, transport);
const search = createClient(ConversationSearchService, transport);
const headers = { "x-memoria-tenant": "acme", "x-memoria-principal": "ana-ts" };

// The model rewrites the whole block; the answer lists the lines it removed and added.
const saved = await blocks.rewriteMemoryBlock(
  { text: "Preferred name: Ana\nUses Jira account ana-42", writer: Writer.MODEL },
  { headers },
);
console.log("added:", saved.addedLines, "removed:", saved.removedLines);

// Every turn: the section goes last in the system prompt.
const { promptSection } = await blocks.renderMemoryBlock({}, { headers });
console.log(promptSection);

// An over-limit block is refused, never cut: the counts are in the ErrorInfo.
let reason = "";
try {
  await blocks.rewriteMemoryBlock({ text: "x".repeat(4001), writer: Writer.MODEL }, { headers });
} catch (e) {
  const [info] = ConnectError.from(e).findDetails(ErrorInfoSchema);
  reason = info.reason;
  console.log("refused:", reason, info.metadata.char_count, "of", info.metadata.char_limit);
}

// After the answer: send the finished turn (wait: searchable when this returns).
const conversationId = `quickstart-${randomUUID().slice(0, 8)}`;
const indexed = await search.indexTurn(
  {
    conversationId,
    turnId: "1",
    question: "Which account did the refund go to?",
    answer: "To acct-4821, on 2026-11-02.",
    turnTime: timestampNow(),
    wait: true,
  },
  { headers },
);
console.log("indexed:", IndexTurnOutcome[indexed.outcome]);

// Only when a question points back to an earlier conversation.
const { hits } = await search.searchConversations({ query: "acct-4821", pageSize: 5 }, { headers });
for (const hit of hits) {
  console.log(
    `${hit.conversationId}/${hit.turnId} (keyword rank ${hit.keywordRank}, semantic rank ${hit.semanticRank}): ${hit.text}`,
  );
}

if (
  !promptSection.endsWith("Uses Jira account ana-42") ||
  reason !== "ERROR_REASON_BLOCK_TOO_LONG" ||
  !hits.some((hit) => hit.conversationId === conversationId)
) {
  throw new Error("quickstart: the section, the refusal or the search did not show what was expected");
}
