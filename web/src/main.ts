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
 * Each section says what its actions did in its own live region (`.outcome`, role=status), next
 * to the controls, and keyboard focus is moved on when the control that had it goes away (a
 * confirmation answered, a conversation deleted, the sign-in form replaced).
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
 * sets the identity itself).
 *
 * Kept in sessionStorage so that a reload stays signed in, and never in localStorage: session
 * storage belongs to this tab and is gone when the tab closes, while local storage is shared by
 * every tab of the origin and outlives the browser, so a bearer token left there would stay
 * usable by anyone at this computer (and by any script the origin ever serves) long after the
 * person is done. Sign out removes it at once. */
const identity = {
  mode: (sessionStorage.getItem("memoria.mode") as Mode | null) ?? defaultMode(),
  token: sessionStorage.getItem("memoria.token") ?? "",
  tenant: sessionStorage.getItem("memoria.tenant") ?? "",
  principal: sessionStorage.getItem("memoria.principal") ?? "",
};
const IDENTITY_KEYS = ["mode", "token", "tenant", "principal", "signedIn"] as const;

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
/** The turn the inspector shows, and the button that opened it (where Close returns focus). */
let inspected: { conversationId: string; opener: HTMLElement } | undefined;
/** Numbers the element ids made per conversation (a conversation id may hold any character). */
let nextId = 0;

/** The live region of each section: an action's outcome is said next to its control. */
type Region = "sign-in" | "block" | "settings" | "history" | "conversations" | "erase";

function say(region: Region, text: string, isError = false): void {
  const status = $(`${region}-status`);
  status.textContent = text;
  status.classList.toggle("error", isError);
}

/** "1 turn", "2 turns": a count with its noun. */
function count(n: number, noun: string): string {
  return `${n.toLocaleString("en-US")} ${noun}${n === 1 ? "" : "s"}`;
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
        inspect.addEventListener("click", () => void inspectTurn(turn.conversationId, turn.turnId, inspect, "block"));
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
    say("block", "An empty memory is not saved. To delete everything, use Clear all.", true);
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
    say("block", answer.changed ? "Saved." : "Nothing to save: your memory already says exactly this.");
    await loadLines();
    await loadAudit(true);
  } catch (error) {
    if (reasonOf(error) === "ERROR_REASON_ETAG_MISMATCH") {
      $("conflict").hidden = false; // the edited text stays in the box
      say("block", "Memory was changed elsewhere. Your edits are still here and nothing was saved.", true);
      return;
    }
    say("block", describe(error), true);
  }
}

async function clearAll(): Promise<void> {
  $("clear-confirm").hidden = true;
  $("block").focus(); // the confirmation that had focus is gone
  try {
    await blocks.deleteMemoryBlock({ writer: Writer.USER });
    await loadBlock();
    say("block", "Your memory was cleared.");
    await loadAudit(true);
  } catch (error) {
    say("block", describe(error), true);
  }
}

/** Asks once more before a destructive action: shows its confirmation with focus on Cancel,
 * the harmless answer, so a second Enter does not destroy anything. */
function ask(box: HTMLElement, cancel: HTMLElement): void {
  box.hidden = false;
  cancel.focus();
}

/** Closes a confirmation unanswered, returning focus to the button that asked for it. */
function dismiss(box: HTMLElement, asker: HTMLElement): void {
  box.hidden = true;
  asker.focus();
}

async function loadSettings(): Promise<void> {
  const { settings } = await blocks.getMemorySettings({});
  showEnabled(settings?.memoryEnabled ?? true);
}

/** The checkbox, and what the Memory card says about the text: loaded on every turn or not. */
function showEnabled(enabled: boolean): void {
  $<HTMLInputElement>("memory-enabled").checked = enabled;
  $("block-hint").textContent = enabled
    ? "This text is placed in the assistant's instructions on every turn."
    : "Memory is off: this text is not placed in the assistant's instructions, and the assistant " +
      "cannot change it. You can still edit it here.";
}

async function setEnabled(enabled: boolean): Promise<void> {
  try {
    const { settings } = await blocks.updateMemorySettings({
      memoryEnabled: enabled,
      writer: Writer.USER,
    });
    showEnabled(settings?.memoryEnabled ?? enabled);
    say("settings", enabled ? "Memory is on." : "Memory is off: the assistant will not see or change it.");
    await loadAudit(true);
  } catch (error) {
    $<HTMLInputElement>("memory-enabled").checked = !enabled;
    say("settings", describe(error), true);
  }
}

const ACTION_WORDS: Record<number, string> = {
  [AuditAction.BLOCK_REWRITTEN]: "changed the memory",
  [AuditAction.BLOCK_DELETED]: "cleared the memory",
  [AuditAction.SETTINGS_UPDATED]: "changed the settings",
  [AuditAction.CONVERSATION_DELETED]: "deleted a conversation",
  [AuditAction.PRINCIPAL_DATA_ERASED]: "erased all data",
  [AuditAction.TURNS_EXPIRED]: "removed old conversation turns",
};

function auditItem(event: AuditEvent): HTMLElement {
  const item = element("li");
  item.dataset["action"] = AuditAction[event.action] ?? "";
  // Expired turns are removed by the service itself, under the organization's retention.
  const who =
    event.action === AuditAction.TURNS_EXPIRED
      ? "Memoria"
      : event.writer === Writer.MODEL
        ? "The assistant"
        : event.writer === Writer.USER
          ? "You"
          : "Someone";
  const head = element("div");
  head.append(element("strong", `${who} ${ACTION_WORDS[event.action] ?? "made a change"}`), ` · ${when(event.createTime)}`);
  item.append(head);
  if (event.action === AuditAction.SETTINGS_UPDATED && event.memoryEnabled !== undefined) {
    item.append(element("div", event.memoryEnabled ? "Memory turned on" : "Memory turned off"));
  }
  if (event.action === AuditAction.BLOCK_DELETED) {
    item.append(element("div", `${count(event.removedLineCount, "line")} removed`));
  }
  if (event.action === AuditAction.CONVERSATION_DELETED) {
    item.append(element("div", `Conversation ${event.conversationId} (${count(event.deletedTurnCount, "turn")})`));
  }
  if (event.action === AuditAction.TURNS_EXPIRED) {
    item.append(
      element("div", `${count(event.deletedTurnCount, "turn")} older than your organization keeps them`),
    );
  }
  if (event.action === AuditAction.PRINCIPAL_DATA_ERASED) {
    item.append(
      element("div", `${count(event.removedLineCount, "line")} and ${count(event.deletedTurnCount, "turn")} removed`),
    );
  }
  for (const line of event.removedLines) item.append(element("div", `− ${line}`, "lines removed"));
  for (const line of event.addedLines) item.append(element("div", `+ ${line}`, "lines added"));
  const changed = event.removedLineCount + event.addedLineCount;
  if (event.action === AuditAction.BLOCK_REWRITTEN && changed > 0) {
    if (event.removedLines.length === 0 && event.addedLines.length === 0) {
      // The server blanks the lines of every earlier change when the block is cleared or the
      // data erased (deleted content is not kept): say so, rather than show an empty change.
      item.append(
        element(
          "div",
          `${count(event.removedLineCount, "line")} removed, ${event.addedLineCount.toLocaleString("en-US")} added. ` +
            "Their text was deleted when your memory was cleared or erased: deleted content is not kept.",
          "blanked",
        ),
      );
    }
  }
  return item;
}

function historyOpen(): boolean {
  return !$("history-body").hidden;
}

/** The history, newest first, 20 at a time; read only while it is open. */
async function loadAudit(fromStart: boolean): Promise<void> {
  if (!historyOpen()) return;
  if (fromStart) auditPageToken = "";
  try {
    const page = await audit.listAuditEvents({ pageSize: 20, pageToken: auditPageToken });
    const list = $("audit");
    if (fromStart) list.replaceChildren();
    for (const event of page.events) list.append(auditItem(event));
    if (fromStart && page.events.length === 0) list.append(element("li", "No changes yet."));
    auditPageToken = page.nextPageToken;
    $("audit-more").hidden = auditPageToken === "";
    const shown = list.querySelectorAll("li[data-action]").length;
    say(
      "history",
      shown === 0
        ? "No changes yet."
        : `${count(shown, "change")} shown, newest first${auditPageToken ? "; older ones below" : ""}.`,
    );
  } catch (error) {
    say("history", describe(error), true);
  }
}

/** Shows or hides the history (a disclosure: the button keeps focus and says its state). */
async function toggleHistory(): Promise<void> {
  const opening = !historyOpen();
  $("history-body").hidden = !opening;
  $("history-toggle").textContent = opening ? "Hide history" : "Show history";
  $("history-toggle").setAttribute("aria-expanded", String(opening));
  if (opening) {
    await loadAudit(true);
  } else {
    $("audit").replaceChildren();
    say("history", "");
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
    list.replaceChildren();
    say("conversations", describe(error), true);
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
  const title = conversationTitle(conversation);
  const turns = element("div", "", "turns");
  turns.hidden = true;
  turns.id = `turns-${++nextId}`;
  const open = element("button", "Read", "open-conversation");
  open.setAttribute("aria-expanded", "false");
  open.setAttribute("aria-controls", turns.id);
  open.setAttribute("aria-label", `Read “${title}”`);
  open.addEventListener("click", async () => {
    const opening = turns.hidden;
    if (opening && !(await loadTurns(conversationId, turns, true))) return;
    turns.hidden = !opening;
    open.textContent = opening ? "Hide" : "Read";
    open.setAttribute("aria-label", `${opening ? "Hide" : "Read"} “${title}”`);
    open.setAttribute("aria-expanded", String(opening));
    if (opening) say("conversations", `“${title}”: ${count(turns.querySelectorAll(".turn").length, "turn")} shown below.`);
  });
  const remove = element("button", "Delete", "danger");
  remove.classList.add("delete-conversation");
  remove.setAttribute("aria-label", `Delete “${title}”`);
  const question = element("p", "Delete this conversation? It cannot be undone.");
  question.id = `delete-question-${nextId}`;
  const yes = element("button", "Yes, delete it", "danger");
  yes.classList.add("confirm-delete");
  const no = element("button", "Cancel", "cancel-delete");
  const confirmation = element("div", "", "warning delete-confirm");
  confirmation.setAttribute("role", "group");
  confirmation.setAttribute("aria-labelledby", question.id);
  confirmation.hidden = true;
  confirmation.append(question, yes, no);
  remove.addEventListener("click", () => ask(confirmation, no));
  no.addEventListener("click", () => dismiss(confirmation, remove));
  yes.addEventListener("click", async () => {
    try {
      await conversations.deleteConversation({ conversationId });
    } catch (error) {
      say("conversations", describe(error), true);
      return;
    }
    // Focus goes to the next conversation (else the list's heading), as this one is gone.
    const next = item.nextElementSibling ?? item.previousElementSibling;
    item.remove();
    if (inspected?.conversationId === conversationId) closeInspection(false);
    const target = next?.querySelector<HTMLElement>("button.open-conversation") ?? $("conversations-title");
    target.focus();
    say("conversations", `“${title}” was deleted.`);
    if ($("conversations").children.length === 0) await loadConversations(true);
    await loadAudit(true);
  });
  const buttons = element("div", "", "actions");
  buttons.append(open, remove);
  item.append(buttons, confirmation, turns);
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
    say("conversations", describe(error), true);
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
  inspect.addEventListener("click", () => void inspectTurn(conversationId, turn.turnId, inspect, "conversations"));
  block.append(inspect);
  return block;
}

/** The inspector: which memory version the turn rendered and which searches it made. Focus
 * moves to its heading; a failure is said in the section of the button that asked. */
async function inspectTurn(conversationId: string, turnId: string, opener: HTMLElement, region: Region): Promise<void> {
  let inspection: TurnInspection | undefined;
  try {
    const turn = create(TurnReferenceSchema, { conversationId, turnId });
    inspection = (await conversations.getTurnInspection({ turn })).inspection;
  } catch (error) {
    say(region, describe(error), true);
    return;
  }
  inspected = { conversationId, opener };
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
    block.append(element("p", `Searched for “${search.query}”${scope(search)} ${when(search.searchTime)}: ${search.hitCount} found`));
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
  $("inspection-title").focus(); // scrolls it into view too
}

/** Where a search looked, when the model bounded it: " in conversation c, from D, before D". */
function scope(search: { conversationId: string; startTime?: Timestamp; endTime?: Timestamp }): string {
  const parts = [];
  if (search.conversationId) parts.push(`in conversation ${search.conversationId}`);
  if (search.startTime) parts.push(`from ${when(search.startTime)}`);
  if (search.endTime) parts.push(`before ${when(search.endTime)}`);
  return parts.length > 0 ? ` ${parts.join(", ")}` : "";
}

/** Empties and hides the inspector (its conversation was deleted, the data erased, the person
 * signed out), returning focus to what opened it when asked and that is still on the page. */
function closeInspection(returnFocus: boolean): void {
  const opener = inspected?.opener;
  inspected = undefined;
  $("inspection").hidden = true;
  $("inspection-title").textContent = "";
  $("inspection-body").replaceChildren();
  if (returnFocus) (opener?.isConnected ? opener : $("conversations-title")).focus();
}

async function eraseAll(): Promise<void> {
  $("erase-confirm").hidden = true;
  $("erase").focus(); // the confirmation that had focus is gone
  try {
    await conversations.erasePrincipalData({});
  } catch (error) {
    say("erase", describe(error), true);
    return;
  }
  closeInspection(false);
  say("erase", "All your data was erased. The history keeps who changed what and when, with counts only.");
  await loadEverything();
}

async function loadEverything(): Promise<void> {
  try {
    await loadBlock();
    await loadSettings();
  } catch (error) {
    signOut(true); // what was typed stays in the form, to correct
    say("sign-in", describe(error), true);
    return;
  }
  sessionStorage.setItem("memoria.signedIn", "1");
  showSignedIn(true);
  $("account").hidden = false;
  await loadAudit(true);
  await loadConversations(true);
}

/** Loads a list's next page; when its "more" button goes away with the last page, focus moves
 * to the first entry it added (its first button, else the entry itself). */
async function showMore(listId: string, buttonId: string, load: () => Promise<void>): Promise<void> {
  const before = $(listId).children.length;
  await load();
  if (!$(buttonId).hidden) return;
  const first = $(listId).children[before] as HTMLElement | undefined;
  if (first === undefined) return;
  const button = first.querySelector<HTMLElement>("button");
  if (button) {
    button.focus();
  } else {
    first.tabIndex = -1;
    first.focus();
  }
}

function showMode(): void {
  $("token-fields").hidden = identity.mode !== "token";
  $("header-fields").hidden = identity.mode !== "headers";
}

/** The sign-in form, or who the page is signed in as with Sign out (which keeps the page short:
 * Save stays in the first screen). */
function showSignedIn(signedIn: boolean): void {
  $("sign-in-form").hidden = signedIn;
  $("signed-in").hidden = !signedIn;
  const who = $("who");
  if (identity.mode === "headers") {
    // Each id in a span of its own (class "id"), so a narrow screen moves the whole id to the
    // next line rather than breaking it after a hyphen, where it reads as two words.
    who.replaceChildren(
      "You are ",
      element("span", identity.principal, "id"),
      " of tenant ",
      element("span", identity.tenant, "id"),
      ".",
    );
  } else {
    who.textContent =
      identity.mode === "token" ? "You are signed in with your access token." : "You are signed in by the proxy.";
  }
}

/** What is missing from the sign-in form, with the field to fix (undefined when nothing is). */
function missing(): [string, HTMLElement] | undefined {
  if (identity.mode === "token" && identity.token === "") {
    return ["Paste your access token to sign in.", $("token")];
  }
  if (identity.mode === "headers" && identity.tenant === "") {
    return ["The tenant is missing: type your tenant (your organisation on this server) to sign in.", $("tenant")];
  }
  if (identity.mode === "headers" && identity.principal === "") {
    return ["The person is missing: type who you are to sign in.", $("principal")];
  }
  return undefined;
}

/** Forgets the identity (this tab's storage and, unless `keepForm`, the token typed) and
 * everything shown of the account, back to the sign-in form. */
function signOut(keepForm: boolean): void {
  for (const key of IDENTITY_KEYS) sessionStorage.removeItem(`memoria.${key}`);
  if (!keepForm) {
    identity.token = "";
    $<HTMLTextAreaElement>("token").value = "";
  }
  closeInspection(false);
  $("account").hidden = true;
  $<HTMLTextAreaElement>("block").value = "";
  $("lines").replaceChildren();
  $("audit").replaceChildren();
  $("conversations").replaceChildren();
  for (const region of ["block", "settings", "history", "conversations", "erase"] as const) say(region, "");
  baseline = { etag: "", text: "" };
  showSignedIn(false);
}

async function signIn(): Promise<void> {
  identity.token = $<HTMLTextAreaElement>("token").value.trim();
  identity.tenant = $<HTMLInputElement>("tenant").value.trim();
  identity.principal = $<HTMLInputElement>("principal").value.trim();
  for (const id of ["token", "tenant", "principal"]) $(id).removeAttribute("aria-invalid");
  const problem = missing();
  if (problem) {
    const [sentence, field] = problem;
    field.setAttribute("aria-invalid", "true");
    say("sign-in", sentence, true);
    field.focus();
    return;
  }
  for (const key of ["mode", "token", "tenant", "principal"] as const) sessionStorage.setItem(`memoria.${key}`, identity[key]);
  say("sign-in", "Signing in…");
  await loadEverything();
  if (!$("account").hidden) {
    say("sign-in", "Signed in. Your memory is below.");
    $("block").focus(); // the form that had focus is gone: on to the memory itself
  }
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
  $("connect").addEventListener("click", () => void signIn());
  $("sign-out").addEventListener("click", () => {
    signOut(false);
    say("sign-in", "You are signed out of this page.");
    $(identity.mode === "token" ? "token" : identity.mode === "headers" ? "tenant" : "connect").focus();
  });
  $("block").addEventListener("input", updateCount);
  $("save").addEventListener("click", () => void save(false));
  $("overwrite").addEventListener("click", () => void save(true));
  $("load-server").addEventListener("click", async () => {
    try {
      await loadBlock();
      say("block", "Showing the latest saved memory.");
      $("block").focus();
    } catch (error) {
      say("block", describe(error), true);
    }
  });
  $("clear").addEventListener("click", () => ask($("clear-confirm"), $("clear-no")));
  $("clear-no").addEventListener("click", () => dismiss($("clear-confirm"), $("clear")));
  $("clear-yes").addEventListener("click", () => void clearAll());
  $("memory-enabled").addEventListener("change", (event) => {
    void setEnabled((event.target as HTMLInputElement).checked);
  });
  $("history-toggle").addEventListener("click", () => void toggleHistory());
  $("audit-more").addEventListener("click", () => void showMore("audit", "audit-more", () => loadAudit(false)));
  $("inspection-close").addEventListener("click", () => closeInspection(true));
  $("conversations-more").addEventListener(
    "click",
    () => void showMore("conversations", "conversations-more", () => loadConversations(false)),
  );
  $("erase").addEventListener("click", () => ask($("erase-confirm"), $("erase-no")));
  $("erase-no").addEventListener("click", () => dismiss($("erase-confirm"), $("erase")));
  $("erase-yes").addEventListener("click", () => void eraseAll());
  document.body.dataset["ready"] = "1";
  // Signed in earlier in this tab (a reload): show the account again without asking.
  if (sessionStorage.getItem("memoria.signedIn") === "1") {
    showSignedIn(true);
    void loadEverything();
  }
}

start();
