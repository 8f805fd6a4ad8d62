/**
 * Memoria for the Vercel AI SDK: the model's two tools, and a language model middleware that
 * puts the memory section last in the system prompt and finishes the turn when the answer is
 * done. A thin layer over the turn adapter (@memoria/client's MemoriaAdapter): every call names
 * the turn the backend started with `memory.startTurn(...)`, and every sentence the model reads
 * comes from the server.
 */
import type { LanguageModelV3Content, LanguageModelV3Prompt, LanguageModelV3StreamPart } from "@ai-sdk/provider";
import type { MemoriaAdapter, ToolResult } from "@memoria/client";
import { jsonSchema, tool, type JSONSchema7, type LanguageModelMiddleware, type ToolSet } from "ai";

/**
 * The server's two tools (memory_rewrite, conversation_search) for `generateText` /
 * `streamText`. The JSON Schemas are the server's, without a validator: the server checks the
 * arguments and words every outcome. The model reads the server's text, as an error result when
 * the call did not do what was asked.
 */
export function memoriaTools(memory: MemoriaAdapter): ToolSet {
  const tools: ToolSet = {};
  for (const { name, description, parametersJsonSchema } of memory.modelTools.tools) {
    tools[name] = tool<unknown, ToolResult>({
      description,
      inputSchema: jsonSchema(JSON.parse(parametersJsonSchema) as JSONSchema7),
      execute: (input) => memory.executeToolCall(name, input as object),
      toModelOutput: ({ output }) => ({ type: output.isError ? "error-text" : "text", value: output.text }),
    });
  }
  return tools;
}

/**
 * For `wrapLanguageModel({ model, middleware: memoriaMiddleware(memory) })`. Before each model
 * call it renders the section for the current turn and puts it at the end of the system prompt
 * (after the last system message's text, or as the only system message), so a changed block
 * costs only the end of the provider's prompt cache and a call after a write sees the saved
 * block. When a call answers without asking for a tool, the answer is done: it sends the turn
 * (the last user message and the answer's text) to conversation search, which ends the turn.
 */
export function memoriaMiddleware(memory: MemoriaAdapter): LanguageModelMiddleware {
  return {
    specificationVersion: "v3",
    transformParams: async ({ params }) => ({
      ...params,
      prompt: withSection(params.prompt, await memory.promptSection()),
    }),
    wrapGenerate: async ({ doGenerate, params }) => {
      const result = await doGenerate();
      if (!result.content.some((part) => part.type === "tool-call")) {
        memory.finishTurn(question(params.prompt), answerText(result.content));
      }
      return result;
    },
    wrapStream: async ({ doStream, params }) => {
      const { stream, ...rest } = await doStream();
      let text = "";
      let toolCalls = false;
      const watch = new TransformStream<LanguageModelV3StreamPart, LanguageModelV3StreamPart>({
        transform(part, controller) {
          if (part.type === "text-delta") text += part.delta;
          if (part.type === "tool-call") toolCalls = true;
          if (part.type === "finish" && !toolCalls) memory.finishTurn(question(params.prompt), text);
          controller.enqueue(part);
        },
      });
      return { stream: stream.pipeThrough(watch), ...rest };
    },
  };
}

function withSection(prompt: LanguageModelV3Prompt, section: string): LanguageModelV3Prompt {
  const last = prompt.findLastIndex((message) => message.role === "system");
  if (last === -1) return [{ role: "system", content: section }, ...prompt];
  return prompt.map((message, i) =>
    i === last && message.role === "system" ? { ...message, content: `${message.content}\n\n${section}` } : message,
  );
}

/** The text of the prompt's last user message: the question of the turn. */
function question(prompt: LanguageModelV3Prompt): string {
  const user = prompt.findLast((message) => message.role === "user");
  return user?.role === "user" ? user.content.map((part) => (part.type === "text" ? part.text : "")).join("") : "";
}

function answerText(content: LanguageModelV3Content[]): string {
  return content.map((part) => (part.type === "text" ? part.text : "")).join("");
}
