/**
 * @memoria/client: Memoria for a TypeScript backend. The turn adapter (MemoriaAdapter), a thin
 * layer over the server's ModelToolService, and the memory block's character count, computed
 * exactly as the server computes it.
 */
export { MemoriaAdapter, NoTurnError } from "./adapter.js";
export type { AdapterOptions, Identity, Shape, ToolResult } from "./adapter.js";
export { charCount, sanitize } from "./charcount.js";
