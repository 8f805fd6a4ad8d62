/**
 * The generated TypeScript stubs (protobuf-es v2 + Connect v2 over gRPC) against a running
 * Memoria server. The test starts nothing: scripts/test-clients.sh starts the server and passes
 * its address in MEMORIA_SERVER (host:port on loopback, trusted-headers mode; the older
 * MEMORIA_ADDR is read too).
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";

import { timestampNow } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import { charCount, sanitize } from "../src/charcount.js";
import { BadRequestSchema, ErrorInfoSchema } from "../gen/google/rpc/error_details_pb.js";
import { AuditAction, AuditService } from "../gen/memoria/v1/audit_service_pb.js";
import {
  ConversationSearchService,
  IndexTurnOutcome,
} from "../gen/memoria/v1/conversation_search_service_pb.js";
import { ErrorReason } from "../gen/memoria/v1/error_reason_pb.js";
import { Writer } from "../gen/memoria/v1/memory_block_pb.js";
import { MemoryBlockService } from "../gen/memoria/v1/memory_block_service_pb.js";

const addr = process.env.MEMORIA_SERVER || process.env.MEMORIA_ADDR;
if (!addr) throw new Error("MEMORIA_SERVER is not set: scripts/test-clients.sh starts the server and sets it");

const transport = createGrpcTransport({ baseUrl: `http://${addr}` });
const blocks = createClient(MemoryBlockService, transport);
const audit = createClient(AuditService, transport);
const search = createClient(ConversationSearchService, transport);

// A fresh tenant per run, so runs against the same server never see each other's data.
const tenant = `ts-${randomUUID().slice(0, 8)}`;
const LIMIT = 4000;

/** Trusted-headers identity of one principal of this run's tenant. */
function as(principal: string): { headers: Record<string, string> } {
  return { headers: { "x-memoria-tenant": tenant, "x-memoria-principal": principal } };
}

/** Runs `call`, which must fail; returns the error with its ErrorInfo decoded. */
async function expectError(
  call: () => Promise<unknown>,
  code: Code,
  reason: ErrorReason,
): Promise<{ err: ConnectError; metadata: Record<string, string> }> {
  let caught: unknown;
  try {
    await call();
  } catch (e) {
    caught = e;
  }
  assert.ok(caught !== undefined, `expected ${Code[code]} ${ErrorReason[reason]}, but the call succeeded`);
  const err = ConnectError.from(caught);
  assert.equal(Code[err.code], Code[code], err.message);
  // Connect reads grpc-status-details-bin (a google.rpc.Status) into err.details.
  const infos = err.findDetails(ErrorInfoSchema);
  assert.equal(infos.length, 1, "exactly one google.rpc.ErrorInfo detail");
  assert.equal(infos[0].domain, "memoria.v1");
  assert.equal(infos[0].reason, `ERROR_REASON_${ErrorReason[reason]}`);
  return { err, metadata: infos[0].metadata };
}

function violatedFields(err: ConnectError): string[] {
  return err.findDetails(BadRequestSchema).flatMap((b) => b.fieldViolations.map((v) => v.field));
}

// ---- the shared character-count vectors (tests/vectors/README.md) ----

type Part = string | { repeat: string; times: number };
type Text = string | Part[];
interface Case {
  name: string;
  input: Text;
  sanitized: Text;
  char_count: number;
  empty: boolean;
  over_limit: boolean;
}

function expand(text: Text): string {
  if (typeof text === "string") return text;
  return text.map((p) => (typeof p === "string" ? p : p.repeat.repeat(p.times))).join("");
}

const vectors = JSON.parse(
  readFileSync(new URL("../../../../tests/vectors/char_count.json", import.meta.url), "utf8"),
) as { limit: number; unicode_version: string; cases: Case[] };

describe("character count helper", () => {
  test("loads the vectors", () => {
    assert.equal(vectors.limit, LIMIT);
    assert.ok(vectors.cases.length >= 50, `only ${vectors.cases.length} cases`);
  });

  for (const c of vectors.cases) {
    test(c.name, () => {
      const input = expand(c.input);
      const count = charCount(input);
      assert.equal(sanitize(input), expand(c.sanitized));
      assert.equal(count, c.char_count);
      assert.equal(count === 0, c.empty);
      assert.equal(count > vectors.limit, c.over_limit);
    });
  }

  test("counts code points, not UTF-16 units", () => {
    const emoji = "\u{1F600}".repeat(LIMIT);
    assert.equal(emoji.length, 2 * LIMIT);
    assert.equal(charCount(emoji), LIMIT);
  });

  test("the version-sensitive case: U+13439..U+1343F are Cf (Unicode 15+) and removed", () => {
    // The server uses Unicode 18 (unicodedata2); Node's ICU must agree for this helper.
    const c = vectors.cases.find((v) => v.name === "egyptian_format_controls_unicode15");
    assert.ok(c, "the vectors lost the Unicode-version case");
    assert.match("\u{13439}", /\p{Cf}/u, `this Node's Unicode (${process.versions.unicode}) is older than 15`);
    assert.equal(charCount(expand(c.input)), c.char_count);
  });
});

// ---- the live server ----

describe("memory block service", () => {
  test("rewrite, get, render, audit, delete", async () => {
    const me = as("ana");
    const text = "Preferred name: Ana\nUses Jira account ana-42\nLikes short answers \u{1F600}";

    const written = await blocks.rewriteMemoryBlock({ text, writer: Writer.MODEL }, me);
    assert.equal(written.changed, true);
    assert.deepEqual(written.removedLines, []);
    assert.deepEqual(written.addedLines, text.split("\n"));
    const block = written.memoryBlock!;
    assert.equal(block.text, text);
    assert.equal(block.charCount, charCount(text));
    assert.notEqual(block.charCount, text.length, "the emoji counts 1, not 2");
    assert.equal(block.charLimit, LIMIT);
    assert.ok(block.etag.length > 0);
    assert.ok(block.updateTime, "update_time is set on a stored block");

    const got = (await blocks.getMemoryBlock({}, me)).memoryBlock!;
    assert.equal(got.text, text);
    assert.equal(got.etag, block.etag);

    const rendered = await blocks.renderMemoryBlock({}, me);
    assert.equal(
      rendered.promptSection,
      `Personal memory (${block.charCount}/4,000 characters)\n${text}`,
    );
    assert.equal(rendered.etag, block.etag);
    assert.equal(rendered.charCount, block.charCount);

    // A second rewrite changes one line; the diff names exactly that line.
    const text2 = text.replace("short", "detailed");
    const second = await blocks.rewriteMemoryBlock({ text: text2, writer: Writer.USER, etag: block.etag }, me);
    assert.deepEqual(second.removedLines, ["Likes short answers \u{1F600}"]);
    assert.deepEqual(second.addedLines, ["Likes detailed answers \u{1F600}"]);

    // A stale etag is refused (settings screen open while the block changed).
    await expectError(
      () => blocks.rewriteMemoryBlock({ text: "stale", writer: Writer.USER, etag: block.etag }, me),
      Code.Aborted,
      ErrorReason.ETAG_MISMATCH,
    );

    const deleted = await blocks.deleteMemoryBlock({ writer: Writer.USER }, me);
    assert.equal(deleted.deleted, true);
    assert.equal(deleted.removedLineCount, 3);
    const gone = (await blocks.getMemoryBlock({}, me)).memoryBlock!;
    assert.equal(gone.text, "");
    assert.equal(gone.etag, "");
    assert.equal((await blocks.renderMemoryBlock({}, me)).promptSection, "");

    // Newest first: the delete, then the two rewrites, by their writers.
    const events = (await audit.listAuditEvents({ pageSize: 10 }, me)).events;
    assert.deepEqual(
      events.map((e) => [AuditAction[e.action], Writer[e.writer]]),
      [
        ["BLOCK_DELETED", "USER"],
        ["BLOCK_REWRITTEN", "USER"],
        ["BLOCK_REWRITTEN", "MODEL"],
      ],
    );
    assert.equal(events[0].removedLineCount, 3);
    assert.ok(events.every((e) => e.principalId === "ana"));
    const onlyDeletes = await audit.listAuditEvents({ actions: [AuditAction.BLOCK_DELETED] }, me);
    assert.equal(onlyDeletes.events.length, 1);
  });

  test("an over-limit block is refused with BLOCK_TOO_LONG, counts in the details", async () => {
    const me = as("over");
    const text = "\u{1F600}".repeat(LIMIT + 1); // .length is 8002; the server counts 4001
    assert.equal(charCount(text), LIMIT + 1);
    const { err, metadata } = await expectError(
      () => blocks.rewriteMemoryBlock({ text, writer: Writer.MODEL }, me),
      Code.InvalidArgument,
      ErrorReason.BLOCK_TOO_LONG,
    );
    assert.equal(metadata.char_count, String(LIMIT + 1));
    assert.equal(metadata.char_limit, String(LIMIT));
    assert.deepEqual(violatedFields(err), ["text"]);

    // Exactly at the limit is accepted, counted the same way.
    const fits = await blocks.rewriteMemoryBlock({ text: text.slice(2), writer: Writer.MODEL }, me);
    assert.equal(fits.memoryBlock!.charCount, LIMIT);
  });

  test("an empty block is refused with BLOCK_EMPTY and the stored one is kept", async () => {
    const me = as("empty");
    await blocks.rewriteMemoryBlock({ text: "keep me", writer: Writer.USER }, me);
    const { err } = await expectError(
      () => blocks.rewriteMemoryBlock({ text: " \u200b\r\n\t\u{FEFF} ", writer: Writer.MODEL }, me),
      Code.InvalidArgument,
      ErrorReason.BLOCK_EMPTY,
    );
    assert.deepEqual(violatedFields(err), ["text"]);
    assert.equal((await blocks.getMemoryBlock({}, me)).memoryBlock!.text, "keep me");
  });

  test("a write without a writer is refused with a BadRequest naming the field", async () => {
    const { err } = await expectError(
      () => blocks.rewriteMemoryBlock({ text: "x" }, as("nowriter")),
      Code.InvalidArgument,
      ErrorReason.INVALID_ARGUMENT,
    );
    assert.deepEqual(violatedFields(err), ["writer"]);
  });

  test("a call without identity is refused with UNAUTHENTICATED", async () => {
    await expectError(() => blocks.getMemoryBlock({}), Code.Unauthenticated, ErrorReason.UNAUTHENTICATED);
  });

  test("the server counts every vector as the helper does", async () => {
    // Ties the helper to the live server, not only to the file: what the server stores and
    // counts (or refuses) for each input is what the helper predicted.
    const me = as("vectors");
    for (const c of vectors.cases) {
      const input = expand(c.input);
      const call = () => blocks.rewriteMemoryBlock({ text: input, writer: Writer.USER }, me);
      if (c.empty) {
        await expectError(call, Code.InvalidArgument, ErrorReason.BLOCK_EMPTY);
      } else if (c.over_limit) {
        const { metadata } = await expectError(call, Code.InvalidArgument, ErrorReason.BLOCK_TOO_LONG);
        assert.equal(metadata.char_count, String(charCount(input)), c.name);
      } else {
        const block = (await call()).memoryBlock!;
        assert.equal(block.text, sanitize(input), c.name);
        assert.equal(block.charCount, charCount(input), c.name);
      }
    }
  });
});

describe("conversation search", () => {
  test(
    "an indexed turn is found by a rare token",
    async () => {
      const me = as("searcher");
      const token = `acct-${Math.floor(100000 + Math.random() * 900000)}`;
      const conversationId = `c-${randomUUID()}`;
      const indexed = await search.indexTurn(
        {
          conversationId,
          turnId: "t1",
          question: `Which account did I open for the invoices? It was ${token}.`,
          answer: `You opened ${token} for the invoices.`,
          turnTime: timestampNow(),
          wait: true,
        },
        me,
      );
      assert.equal(IndexTurnOutcome[indexed.outcome], "INDEXED");
      assert.equal(indexed.chunkCount, 1);

      const found = await search.searchConversations({ query: token, pageSize: 5 }, me);
      assert.ok(found.hits.length >= 1, "the indexed turn is found");
      const hit = found.hits[0];
      assert.equal(hit.conversationId, conversationId);
      assert.equal(hit.turnId, "t1");
      assert.ok(hit.text.includes(token));
      assert.ok(hit.keywordRank >= 1, "keyword retrieval found the rare token");
      assert.ok(hit.score > 0);

      // Another principal of the same tenant finds nothing of it.
      const other = await search.searchConversations({ query: token }, as("someone-else"));
      assert.ok(other.hits.every((h) => h.conversationId !== conversationId));
    },
  );
});
