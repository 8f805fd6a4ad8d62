/**
 * The settings page (DESIGN 2, issue 12): the person sees and edits the exact text the prompt
 * carries, with its count against the limit as they type; turns memory off; reads who changed
 * it and when; lists past conversations (newest first, titled by their first question) and
 * reads or deletes one; deletes everything. It calls the same contract as every
 * other client, over Connect from the server's HTTP port (server/rpc/web.py).
 *
 * Each line of the saved memory says where it came from (when it was added, by the assistant or
 * by the person, in which conversation and turn, with that turn's inspector one click away), and
 * lines that repeat each other are pointed out as the assistant is told after a write (issue 25).
 *
 * Everything shown comes through textContent or form values, never innerHTML: a block holding
 * markup displays as text (and the server's Content-Security-Policy forbids inline script on
 * top of that).
 */
import { create } from "@bufbuild/protobuf";
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { charCount } from "../../clients/ts/src/charcount.js";
import { AuditAction, AuditService, type AuditEvent } from "../../generated/ts/memoria/v1/audit_service_pb.js";
import {
  type Conversation,
  ConversationSearchService,
  type ExportedTurn,
  type TurnInspection,
} from "../../generated/ts/memoria/v1/conversation_search_service_pb.js";
import { TurnReferenceSchema, Writer } from "../../generated/ts/memoria/v1/memory_block_pb.js";
import {
  DuplicateKind,
  MemoryBlockService,
  type DuplicateLines,
  type GetMemoryBlockResponse,
  MemoryBlockView,
} from "../../generated/ts/memoria/v1/memory_block_service_pb.js";
import { describe, reasonOf } from "./errors.js";

type Mode = "token" | "headers" | "proxy";

const $ = <T extends HTMLElement>(id: string): T => {
  const element = document.getElementById(id);
  if (!element) throw new Error(`missing #${id}`);
  return element as T;
};

/** Who the page calls as: a bearer token, the trusted headers (a server on loopback, or a
 * proxy that lets them through), or nothing (a proxy in front authenticates the person and
 * sets the identity itself). Kept for this tab only. */
const identity = {
  mode: (sessionStorage.getItem("memoria.mode") as Mode | null) ?? defaultMode(),
  token: sessionStorage.getItem("memoria.token") ?? "",
  tenant: sessionStorage.getItem("memoria.tenant") ?? "",
  principal: sessionStorage.getItem("memoria.principal") ?? "",
};

function defaultMode(): Mode {
  const host = location.hostname;
  return host === "localhost" || host === "127.0.0.1" || host === "[::1]" ? "headers" : "token";
}

const withIdentity: Interceptor = (next) => async (request) => {
  if (identity.mode === "token" && identity.token) {
    request.header.set("authorization", `Bearer ${identity.token}`);
  } else if (identity.mode === "headers") {
    request.header.set("x-memoria-tenant", identity.tenant);
    request.header.set("x-memoria-principal", identity.principal);
  }
  return next(request);
};

const transport = createConnectTransport({
  baseUrl: location.origin,
  useBinaryFormat: true,
  interceptors: [withIdentity],
});
const blocks = createClient(MemoryBlockService, transport);
const audit = createClient(AuditService, transport);
const conversations = createClient(ConversationSearchService, transport);

/** The block as loaded when editing began: its etag is what Save sends. */
let baseline = { etag: "", text: "" };
let charLimit = 0;
let auditPageToken = "";
let conversationPageToken = "";

function say(text: string, isError = false): void {
  const message = $("message");
  message.textContent = text;
  message.classList.toggle("error", isError);
}

function when(time: Timestamp | undefined): string {
  return time ? timestampDate(time).toLocaleString() : "";
}

function element(tag: string, text = "", className = ""): HTMLElement {
  const node = document.createElement(tag);
  node.textContent = text;
  if (className) node.className = className;
  return node;
}

function updateCount(): void {
  const count = charCount($<HTMLTextAreaElement>("block").value);
  const line = $("count");
  const limit = charLimit.toLocaleString("en-US");
  const over = charLimit > 0 && count > charLimit;
  line.textContent =
    `${count.toLocaleString("en-US")} / ${limit} characters` +
    (over ? ` (${(count - charLimit).toLocaleString("en-US")} over the limit: shorten it to save)` : "");
  line.classList.toggle("over", over);
  line.dataset["count"] = String(count);
}

async function loadBlock(): Promise<void> {
  const answer = await blocks.getMemoryBlock({ view: MemoryBlockView.FULL });
  const memoryBlock = answer.memoryBlock;
  baseline = { etag: memoryBlock?.etag ?? "", text: memoryBlock?.text ?? "" };
  charLimit = memoryBlock?.charLimit ?? 0;
  $<HTMLTextAreaElement>("block").value = baseline.text;
  $("conflict").hidden = true;
  updateCount();
  showLines(answer);
}

/** Refreshes the saved lines, their origins and repeats (after a save: the box keeps its text). */
async function loadLines(): Promise<void> {
  showLines(await blocks.getMemoryBlock({ view: MemoryBlockView.FULL }));
}

function writerWords(writer: Writer): string {
  return writer === Writer.MODEL ? "the assistant" : writer === Writer.USER ? "you" : "someone";
}

function lineNumbers(indexes: number[]): string {
  const numbers = indexes.map((i) => String(i + 1));
  return numbers.length < 2 ? numbers.join("") : `${numbers.slice(0, -1).join(", ")} and ${numbers.at(-1)}`;
}

/** What a line's duplicate note says: the other lines of its group, and how they resemble it. */
function duplicateNote(group: DuplicateLines, index: number): string {
  const others = group.lineIndexes.filter((i) => i !== index);
  const plural = others.length > 1 ? "lines" : "line";
  return group.kind === DuplicateKind.REPEATED
    ? `Repeats ${plural} ${lineNumbers(others)}`
    : `Nearly the same as ${plural} ${lineNumbers(others)}`;
}

/** The saved block line by line: where each came from and which repeat each other. */
function showLines(answer: GetMemoryBlockResponse): void {
  const lines = answer.memoryBlock?.text ? answer.memoryBlock.text.split("\n") : [];
  const origins = new Map(answer.lineOrigins.map((origin) => [origin.lineIndex, origin]));
  const notes = new Map<number, string[]>();
  for (const group of answer.duplicateLines) {
    for (const index of group.lineIndexes) notes.set(index, [...(notes.get(index) ?? []), duplicateNote(group, index)]);
  }
  const list = $("lines");
  list.replaceChildren();
  lines.forEach((line, index) => {
    if (line.trim() === "") return;
    const item = element("li");
    item.dataset["line"] = String(index + 1);
    item.append(element("span", `${index + 1}`, "number"), element("span", line, "text"));
    const origin = origins.get(index);
    const about = element("div", "", "origin");
    if (origin === undefined) {
      about.textContent = "Where this line came from was not recorded.";
    } else {
      about.textContent = `Added ${when(origin.addTime)} by ${writerWords(origin.writer)}`;
      const turn = origin.turn;
      if (turn !== undefined && turn.conversationId !== "") {
        about.append(` in conversation ${turn.conversationId}, turn ${turn.turnId} `);
        const inspect = element("button", `What turn ${turn.turnId} used`, "inspect");
        inspect.dataset["conversation"] = turn.conversationId;
        inspect.dataset["turn"] = turn.turnId;
        inspect.addEventListener("click", () => void inspectTurn(turn.conversationId, turn.turnId));
        about.append(inspect);
      }
    }
    item.append(about);
    for (const note of notes.get(index) ?? []) {
      item.classList.add("duplicate");
      item.append(element("div", note, "duplicate-note"));
    }
    list.append(item);
  });
  $("lines-section").hidden = lines.length === 0;
  const groups = answer.duplicateLines.length;
  $("duplicates").hidden = groups === 0;
  $("duplicates").textContent =
    groups === 0
      ? ""
      : `${groups === 1 ? "One group of lines repeats" : `${groups} groups of lines repeat`} each other ` +
        "(marked below). Nothing was changed for it; if they say the same thing, merge them into one " +
        "line and save. The assistant is told the same after it writes.";
}

async function save(overwrite: boolean): Promise<void> {
  const text = $<HTMLTextAreaElement>("block").value;
  if (charCount(text) === 0) {
    say("An empty memory is not saved. To delete everything, use Clear all.", true);
    $("clear").focus();
    return;
  }
  try {
    // Save sends the etag from when editing began; "Save again" overwrites (no etag).
    const answer = await blocks.rewriteMemoryBlock({
      text,
      writer: Writer.USER,
      ...(overwrite ? {} : { etag: baseline.etag }),
    });
    const saved = answer.memoryBlock;
    baseline = { etag: saved?.etag ?? "", text: saved?.text ?? "" };
    $<HTMLTextAreaElement>("block").value = baseline.text;
    $("conflict").hidden = true;
    updateCount();
    say(answer.changed ? "Saved." : "Nothing to save: your memory already says exactly this.");
    await loadLines();
    await loadAudit(true);
  } catch (error) {
    if (reasonOf(error) === "ERROR_REASON_ETAG_MISMATCH") {
      $("conflict").hidden = false; // the edited text stays in the box
      say("Memory was changed elsewhere.", true);
      return;
    }
    say(describe(error), true);
  }
}

async function clearAll(): Promise<void> {
  $("clear-confirm").hidden = true;
  try {
    await blocks.deleteMemoryBlock({ writer: Writer.USER });
    await loadBlock();
    say("Your memory was cleared.");
    await loadAudit(true);
  } catch (error) {
    say(describe(error), true);
  }
}

async function loadSettings(): Promise<void> {
  const { settings } = await blocks.getMemorySettings({});
  $<HTMLInputElement>("memory-enabled").checked = settings?.memoryEnabled ?? true;
}

async function setEnabled(enabled: boolean): Promise<void> {
  try {
    const { settings } = await blocks.updateMemorySettings({
      memoryEnabled: enabled,
      writer: Writer.USER,
    });
    $<HTMLInputElement>("memory-enabled").checked = settings?.memoryEnabled ?? enabled;
    say(enabled ? "Memory is on." : "Memory is off: the assistant will not see or change it.");
    await loadAudit(true);
  } catch (error) {
    $<HTMLInputElement>("memory-enabled").checked = !enabled;
    say(describe(error), true);
  }
}

const ACTION_WORDS: Record<number, string> = {
  [AuditAction.BLOCK_REWRITTEN]: "changed the memory",
  [AuditAction.BLOCK_DELETED]: "cleared the memory",
  [AuditAction.SETTINGS_UPDATED]: "changed the settings",
  [AuditAction.CONVERSATION_DELETED]: "deleted a conversation",
  [AuditAction.PRINCIPAL_DATA_ERASED]: "erased all data",
};

function auditItem(event: AuditEvent): HTMLElement {
  const item = element("li");
  item.dataset["action"] = AuditAction[event.action] ?? "";
  const who = event.writer === Writer.MODEL ? "The assistant" : event.writer === Writer.USER ? "You" : "Someone";
  const head = element("div");
  head.append(element("strong", `${who} ${ACTION_WORDS[event.action] ?? "made a change"}`), ` · ${when(event.createTime)}`);
  item.append(head);
  if (event.action === AuditAction.SETTINGS_UPDATED && event.memoryEnabled !== undefined) {
    item.append(element("div", event.memoryEnabled ? "Memory turned on" : "Memory turned off"));
  }
  if (event.action === AuditAction.BLOCK_DELETED) {
    item.append(element("div", `${event.removedLineCount} lines removed`));
  }
  if (event.action === AuditAction.CONVERSATION_DELETED) {
    item.append(element("div", `Conversation ${event.conversationId} (${event.deletedTurnCount} turns)`));
  }
  for (const line of event.removedLines) item.append(element("div", `− ${line}`, "lines removed"));
  for (const line of event.addedLines) item.append(element("div", `+ ${line}`, "lines added"));
  return item;
}

async function loadAudit(fromStart: boolean): Promise<void> {
  if (fromStart) auditPageToken = "";
  try {
    const page = await audit.listAuditEvents({ pageSize: 20, pageToken: auditPageToken });
    const list = $("audit");
    if (fromStart) list.replaceChildren();
    for (const event of page.events) list.append(auditItem(event));
    if (fromStart && page.events.length === 0) list.append(element("li", "No changes yet."));
    auditPageToken = page.nextPageToken;
    $("audit-more").hidden = auditPageToken === "";
  } catch (error) {
    say(describe(error), true);
  }
}

/** Past conversations, newest first, a page at a time (ListConversations): each titled by the
 * opening of its first question with its date, without reading any turn's text. */
async function loadConversations(fromStart: boolean): Promise<void> {
  if (fromStart) conversationPageToken = "";
  const list = $("conversations");
  try {
    const page = await conversations.listConversations({ pageSize: 20, pageToken: conversationPageToken });
    if (fromStart) list.replaceChildren();
    for (const conversation of page.conversations) list.append(conversationItem(conversation));
    if (fromStart && page.conversations.length === 0) list.append(element("li", "No past conversations."));
    conversationPageToken = page.nextPageToken;
    $("conversations-more").hidden = conversationPageToken === "";
  } catch (error) {
    list.replaceChildren(element("li", describe(error)));
    $("conversations-more").hidden = true;
  }
}

/** How a conversation is titled: the opening of its first question (the server cuts it at 100
 * characters), else its id. */
function conversationTitle(conversation: Conversation): string {
  const opening = conversation.firstQuestionOpening;
  if (opening === "") return `Conversation ${conversation.conversationId}`;
  return opening.length >= 100 ? `${opening}…` : opening;
}

function conversationItem(conversation: Conversation): HTMLElement {
  const { conversationId, turnCount } = conversation;
  const item = element("li");
  item.dataset["conversation"] = conversationId;
  const started = conversation.firstTurnTime ? timestampDate(conversation.firstTurnTime).toLocaleDateString() : "";
  const head = element("div", "", "conversation-head");
  head.append(element("strong", conversationTitle(conversation), "title"), ` · ${started}`);
  item.append(
    head,
    element("div", `${turnCount} turn${turnCount === 1 ? "" : "s"} · last ${when(conversation.lastTurnTime)}`, "hint"),
  );
  const turns = element("div", "", "turns");
  turns.hidden = true;
  const open = element("button", "Read", "open-conversation");
  open.setAttribute("aria-expanded", "false");
  open.addEventListener("click", async () => {
    const opening = turns.hidden;
    if (opening && !(await loadTurns(conversationId, turns, true))) return;
    turns.hidden = !opening;
    open.textContent = opening ? "Hide" : "Read";
    open.setAttribute("aria-expanded", String(opening));
  });
  const remove = element("button", "Delete this conversation", "danger");
  remove.classList.add("delete-conversation");
  let armed = false;
  remove.addEventListener("click", async () => {
    if (!armed) {
      armed = true;
      remove.textContent = "Really delete it? Click again";
      return;
    }
    try {
      await conversations.deleteConversation({ conversationId });
      item.remove();
      say(`Conversation ${conversationId} was deleted.`);
      await loadAudit(true);
    } catch (error) {
      say(describe(error), true);
    }
  });
  item.append(open, remove, turns);
  return item;
}

/** One conversation's turns, oldest first, a page at a time (ListConversationTurns): each turn's
 * text as the server holds it, shown as text only, with its inspector one click away. False
 * when the call failed (the message says why). */
async function loadTurns(conversationId: string, into: HTMLElement, fromStart: boolean, pageToken = ""): Promise<boolean> {
  let page;
  try {
    page = await conversations.listConversationTurns({ conversationId, pageSize: 20, pageToken });
  } catch (error) {
    say(describe(error), true);
    return false;
  }
  if (fromStart) into.replaceChildren();
  into.querySelector(".more-turns")?.remove();
  if (fromStart && page.turns.length === 0) into.append(element("p", "This conversation holds no turns any more."));
  const added = page.turns.map((turn) => turnItem(conversationId, turn));
  into.append(...added);
  // "Show later turns" is gone: keep keyboard focus in the conversation, on the first new turn.
  if (!fromStart) added[0]?.querySelector<HTMLElement>("button.inspect")?.focus();
  if (page.nextPageToken !== "") {
    const more = element("button", "Show later turns", "more-turns");
    const token = page.nextPageToken;
    more.addEventListener("click", () => void loadTurns(conversationId, into, false, token));
    into.append(more);
  }
  return true;
}

function turnItem(conversationId: string, turn: ExportedTurn): HTMLElement {
  const block = element("article", "", "turn");
  block.dataset["turn"] = turn.turnId;
  block.append(
    element("div", `Turn ${turn.turnId} · ${when(turn.turnTime)}${turn.indexed ? "" : " · waiting to be indexed"}`, "hint"),
    element("p", turn.text, "turn-text"),
  );
  const inspect = element("button", `What turn ${turn.turnId} used`, "inspect");
  inspect.dataset["turn"] = turn.turnId;
  inspect.addEventListener("click", () => void inspectTurn(conversationId, turn.turnId));
  block.append(inspect);
  return block;
}

/** The inspector: which memory version the turn rendered and which searches it made. */
async function inspectTurn(conversationId: string, turnId: string): Promise<void> {
  let inspection: TurnInspection | undefined;
  try {
    const turn = create(TurnReferenceSchema, { conversationId, turnId });
    inspection = (await conversations.getTurnInspection({ turn })).inspection;
  } catch (error) {
    say(describe(error), true);
    return;
  }
  $("inspection").hidden = false;
  $("inspection-title").textContent = `What turn ${turnId} of ${conversationId} used`;
  const body = $("inspection-body");
  body.replaceChildren();
  const renders = inspection?.renders ?? [];
  const searches = inspection?.searches ?? [];
  const writes = inspection?.writes ?? [];
  if (renders.length === 0 && searches.length === 0 && writes.length === 0) {
    body.append(element("p", "Nothing was recorded for this turn."));
  }
  for (const render of renders) {
    body.append(
      element(
        "p",
        `Memory loaded ${when(render.renderTime)}: ${render.charCount.toLocaleString("en-US")} characters` +
          (render.blockChanged ? " (your memory has changed since)" : " (the same as now)"),
        "render",
      ),
    );
  }
  for (const search of searches) {
    const block = element("div", "", "search");
    block.append(element("p", `Searched for “${search.query}” ${when(search.searchTime)}: ${search.hitCount} found`));
    const hits = element("ol");
    for (const hit of search.hits) {
      hits.append(
        element(
          "li",
          `${hit.conversationId} turn ${hit.turnId}: ${hit.text.slice(0, 200)} ` +
            `(keyword rank ${hit.keywordRank || "none"}, meaning rank ${hit.semanticRank || "none"})`,
        ),
      );
    }
    block.append(hits);
    body.append(block);
  }
  for (const write of writes) {
    const block = element("div", "", "write");
    const who = write.writer === Writer.MODEL ? "The assistant" : write.writer === Writer.USER ? "You" : "Someone";
    block.append(element("p", `${who} changed the memory ${when(write.writeTime)}:`));
    for (const line of write.removedLines) block.append(element("div", `− ${line}`, "lines removed"));
    for (const line of write.addedLines) block.append(element("div", `+ ${line}`, "lines added"));
    if (write.removedLines.length === 0 && write.addedLines.length === 0) {
      block.append(
        element("div", `${write.removedLineCount} lines removed, ${write.addedLineCount} added (their text was deleted since)`),
      );
    }
    body.append(block);
  }
  const failed = inspection?.failedWriteCount ?? 0;
  if (failed > 0) body.append(element("p", `${failed} attempted change${failed === 1 ? "" : "s"} to the memory failed.`, "failed"));
  $("inspection").scrollIntoView({ block: "nearest" });
}

async function eraseAll(): Promise<void> {
  $("erase-confirm").hidden = true;
  try {
    await conversations.erasePrincipalData({});
    say("All your data was erased.");
    await loadEverything();
  } catch (error) {
    say(describe(error), true);
  }
}

async function loadEverything(): Promise<void> {
  try {
    await loadBlock();
    await loadSettings();
  } catch (error) {
    $("account").hidden = true;
    say(describe(error), true);
    return;
  }
  $("account").hidden = false;
  await loadAudit(true);
  await loadConversations(true);
}

function showMode(): void {
  $("token-fields").hidden = identity.mode !== "token";
  $("header-fields").hidden = identity.mode !== "headers";
}

function start(): void {
  $<HTMLInputElement>(`mode-${identity.mode}`).checked = true;
  $<HTMLTextAreaElement>("token").value = identity.token;
  $<HTMLInputElement>("tenant").value = identity.tenant;
  $<HTMLInputElement>("principal").value = identity.principal;
  showMode();
  for (const mode of ["token", "headers", "proxy"] as const) {
    $(`mode-${mode}`).addEventListener("change", () => {
      identity.mode = mode;
      showMode();
    });
  }
  $("connect").addEventListener("click", () => {
    identity.token = $<HTMLTextAreaElement>("token").value.trim();
    identity.tenant = $<HTMLInputElement>("tenant").value.trim();
    identity.principal = $<HTMLInputElement>("principal").value.trim();
    for (const [key, value] of Object.entries(identity)) sessionStorage.setItem(`memoria.${key}`, value);
    say("");
    void loadEverything();
  });
  $("block").addEventListener("input", updateCount);
  $("save").addEventListener("click", () => void save(false));
  $("overwrite").addEventListener("click", () => void save(true));
  $("load-server").addEventListener("click", async () => {
    try {
      await loadBlock();
      say("Showing the latest saved memory.");
    } catch (error) {
      say(describe(error), true);
    }
  });
  $("clear").addEventListener("click", () => ($("clear-confirm").hidden = false));
  $("clear-no").addEventListener("click", () => ($("clear-confirm").hidden = true));
  $("clear-yes").addEventListener("click", () => void clearAll());
  $("memory-enabled").addEventListener("change", (event) => {
    void setEnabled((event.target as HTMLInputElement).checked);
  });
  $("audit-more").addEventListener("click", () => void loadAudit(false));
  $("conversations-more").addEventListener("click", () => void loadConversations(false));
  $("erase").addEventListener("click", () => ($("erase-confirm").hidden = false));
  $("erase-no").addEventListener("click", () => ($("erase-confirm").hidden = true));
  $("erase-yes").addEventListener("click", () => void eraseAll());
  document.body.dataset["ready"] = "1";
}

start();
