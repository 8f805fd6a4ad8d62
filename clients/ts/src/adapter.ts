/**
 * The turn adapter: a thin layer over the server's ModelToolService, the same small API as the
 * Python and Go adapters. Every word the model reads comes from the server (the checks, the
 * wording and the per-turn cap of failed writes live there); the words for a server that
 * cannot be reached are fetched with the tools when the adapter is made. Every render, search
 * and write names the turn, so GetTurnInspection shows what each turn read and wrote.
 */
import { create } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client, type Transport } from "@connectrpc/connect";

import { LocalizedMessageSchema } from "../gen/google/rpc/error_details_pb.js";
import { ConversationSearchService } from "../gen/memoria/v1/conversation_search_service_pb.js";
import { TurnReferenceSchema, type TurnReference } from "../gen/memoria/v1/memory_block_pb.js";
import {
  ModelToolService,
  type GetModelToolsResponse,
} from "../gen/memoria/v1/model_tool_service_pb.js";

/** A provider's shape of the tools list. */
export type Shape = "openai_chat_completions" | "openai_responses" | "anthropic_messages";

/** What a tool call returns: `text` is exactly what the model reads; `isError` marks a call
 * that did not do what was asked (Anthropic's tool_result is_error, MCP's isError). */
export interface ToolResult {
  text: string;
  isError: boolean;
}

/** Who the calls act for: `{ authorization: "Bearer <jwt>" }`, or the trusted headers
 * `{ "x-memoria-tenant": t, "x-memoria-principal": p }`. */
export type Identity = Record<string, string>;

export interface AdapterOptions {
  /** Bounds each call (default 10 000 ms). */
  timeoutMs?: number;
}

const REWRITE = "memory_rewrite";

/** Thrown by a call made outside a turn: call startTurn first. */
export class NoTurnError extends Error {
  constructor() {
    super("memoria: no turn: call startTurn(conversationId, turnId) first");
  }
}

/** Memoria's tools and prompt section for one person's conversation, turn after turn. */
export class MemoriaAdapter {
  private turn: TurnReference | undefined;
  private unseen = false; // this turn's section could not show the block: rewrites are refused
  private pending: Promise<boolean>[] = [];

  private constructor(
    private readonly transport: Transport,
    private readonly identity: Identity,
    private readonly options: AdapterOptions,
    /** The server's GetModelTools answer the adapter was made with. */
    readonly modelTools: GetModelToolsResponse,
    private readonly toolService: Client<typeof ModelToolService> = createClient(ModelToolService, transport),
    private readonly search: Client<typeof ConversationSearchService> = createClient(
      ConversationSearchService,
      transport,
    ),
  ) {}

  /** Fetches the model's tools (GetModelTools) and returns an adapter acting for `identity`;
   * rejects like any call when the server cannot be reached. */
  static async connect(transport: Transport, identity: Identity, options: AdapterOptions = {}): Promise<MemoriaAdapter> {
    const client = createClient(ModelToolService, transport);
    const modelTools = await client.getModelTools({}, MemoriaAdapter.callOptions(identity, options));
    return new MemoriaAdapter(transport, identity, options, modelTools, client);
  }

  /** An adapter for another person (or conversation) sharing this one's fetched tools. */
  forIdentity(identity: Identity): MemoriaAdapter {
    return new MemoriaAdapter(this.transport, identity, this.options, this.modelTools, this.toolService, this.search);
  }

  private static callOptions(identity: Identity, options: AdapterOptions) {
    return { headers: identity, timeoutMs: options.timeoutMs ?? 10_000 };
  }

  /** The tools list to send to a provider, in its shape. */
  tools(shape: Shape): Record<string, unknown>[] {
    return this.modelTools.tools.map((t) => {
      const parameters = JSON.parse(t.parametersJsonSchema) as Record<string, unknown>;
      const strict = strictCompatible(parameters);
      const { name, description } = t;
      switch (shape) {
        case "openai_chat_completions":
          return { type: "function", function: { name, description, parameters, strict } };
        case "openai_responses":
          return { type: "function", name, description, parameters, strict };
        case "anthropic_messages":
          return { name, description, input_schema: parameters };
        default:
          throw new Error(`memoria: unknown tool shape ${String(shape)}`);
      }
    });
  }

  /** Starts a turn: every render, tool call and the finished turn carry these ids. */
  startTurn(conversationId: string, turnId: string): void {
    this.turn = create(TurnReferenceSchema, { conversationId, turnId });
    this.unseen = false;
  }

  private current(): TurnReference {
    if (this.turn === undefined) throw new NoTurnError();
    return this.turn;
  }

  /** The memory part of the system prompt, to put last in it: the instructions, then the
   * block. If the server cannot render it, it is the server's words for that (fetched with the
   * tools), and memory writes are refused without a call for the rest of the turn. */
  async promptSection(): Promise<string> {
    const turn = this.current();
    try {
      const response = await this.toolService.renderPromptSection(
        { turn },
        MemoriaAdapter.callOptions(this.identity, this.options),
      );
      this.unseen = false;
      return response.promptSection;
    } catch (e) {
      console.warn(`memoria: RenderPromptSection failed: ${Code[ConnectError.from(e).code]}`);
      this.unseen = true;
      return this.modelTools.unavailablePromptSection;
    }
  }

  /** Runs one tool call exactly as the model produced it (its name and arguments: JSON text,
   * or the object Anthropic gives) and returns what the model reads. Throws only for the
   * backend's own mistake: NoTurnError, or the server's INVALID_ARGUMENT (invalid turn ids). */
  async executeToolCall(name: string, args: string | object): Promise<ToolResult> {
    const turn = this.current();
    if (name === REWRITE && this.unseen) {
      return { text: this.modelTools.rewriteRefusedUnseenText, isError: true };
    }
    const argumentsJson = typeof args === "string" ? args : JSON.stringify(args);
    try {
      const response = await this.toolService.executeToolCall(
        { turn, toolName: name, argumentsJson },
        MemoriaAdapter.callOptions(this.identity, this.options),
      );
      return { text: response.text, isError: response.isError };
    } catch (e) {
      const error = ConnectError.from(e);
      const [words] = error.findDetails(LocalizedMessageSchema);
      if (words !== undefined) return { text: words.message, isError: true }; // the server's words
      const tool = this.modelTools.tools.find((t) => t.name === name);
      if (error.code === Code.InvalidArgument || tool === undefined) throw error;
      console.warn(`memoria: ExecuteToolCall ${name} got no answer: ${Code[error.code]}`);
      return { text: tool.unreachableText, isError: true };
    }
  }

  /** Sends the finished turn to conversation search without waiting (the server accepts it
   * durably and indexes it shortly after); the turn ends. `flush` waits for those calls. */
  finishTurn(question: string, answer: string): void {
    const turn = this.current();
    this.turn = undefined;
    const request = { conversationId: turn.conversationId, turnId: turn.turnId, question, answer, turnTime: timestampNow() };
    this.pending.push(
      this.search.indexTurn(request, MemoriaAdapter.callOptions(this.identity, this.options)).then(
        () => true,
        (e: unknown) => {
          console.warn(`memoria: IndexTurn failed: ${Code[ConnectError.from(e).code]}`);
          return false;
        },
      ),
    );
  }

  /** Waits for the turns sent by finishTurn; resolves to how many were not accepted. */
  async flush(): Promise<number> {
    const pending = this.pending;
    this.pending = [];
    return (await Promise.all(pending)).filter((accepted) => !accepted).length;
  }
}

/** Whether OpenAI's strict mode accepts the schema (every property required, no others);
 * otherwise the tool is sent with strict false, explicitly, as the Responses API defaults to
 * strict. */
function strictCompatible(parameters: Record<string, unknown>): boolean {
  const properties = Object.keys((parameters.properties as object | undefined) ?? {});
  const required = (parameters.required as string[] | undefined) ?? [];
  return (
    parameters.additionalProperties === false &&
    required.length === properties.length &&
    properties.every((p) => required.includes(p))
  );
}
