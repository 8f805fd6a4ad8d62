/**
 * Every error the server can answer, in words a person understands. The server's ErrorInfo
 * reason (memoria.v1.ErrorReason, docs/api.md "Errors") picks the sentence; a status without one
 * (a proxy in the way, the network) is worded by its code. A raw status or exception text is
 * never shown: it would mean nothing to the person and could say more than it should.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { type ErrorInfo, ErrorInfoSchema } from "../../generated/ts/google/rpc/error_details_pb.js";

const BY_REASON: Record<string, (meta: Record<string, string>) => string> = {
  ERROR_REASON_UNAUTHENTICATED: () =>
    "You are not signed in, or your sign-in has expired. Check who you are above and try again.",
  ERROR_REASON_PERMISSION_DENIED: () => "You are not allowed to do that.",
  ERROR_REASON_INVALID_ARGUMENT: () => "Something in the request was not valid. Nothing was changed.",
  ERROR_REASON_BLOCK_EMPTY: () =>
    "An empty memory is not saved. To delete everything, use Clear all.",
  ERROR_REASON_BLOCK_TOO_LONG: (meta) =>
    `Your memory is ${fmt(meta["char_count"])} characters; the limit is ${fmt(meta["char_limit"])}. ` +
    "Shorten it and save again. Nothing was saved.",
  ERROR_REASON_ETAG_MISMATCH: () => "Memory was changed elsewhere.",
  ERROR_REASON_MEMORY_DISABLED: () =>
    "Memory is turned off, so the assistant cannot change it. You can still edit it here.",
  ERROR_REASON_INVALID_PAGE_TOKEN: () =>
    "The list changed while you were reading it. Reload the page to see it from the start.",
  ERROR_REASON_STORE_UNAVAILABLE: () =>
    "The memory service cannot reach its storage right now. Nothing was changed; try again in a moment.",
  ERROR_REASON_INTERNAL: (meta) =>
    "Something went wrong on the server. Nothing you did caused it" +
    (meta["trace_id"] ? ` (reference ${meta["trace_id"]}).` : "."),
  ERROR_REASON_WRITE_CONFLICT: () =>
    "Your memory was being changed by something else at the same moment. Nothing was saved; try again.",
  ERROR_REASON_CONVERSATION_DELETED: () => "That conversation was deleted.",
  ERROR_REASON_MALFORMED_REQUEST: () =>
    "The page sent something the server could not read. Reload the page and try again.",
  ERROR_REASON_SECRET_DETECTED: () =>
    "Your memory contains what looks like a password, key or token. Remove it: credentials are never stored. Nothing was saved.",
  ERROR_REASON_STORAGE_FULL: () =>
    "The server is out of storage space, so nothing new can be saved right now. Deleting still works.",
  ERROR_REASON_OVERLOADED: () => "The memory service is busy. Nothing was changed; try again in a moment.",
};

const BY_CODE: Partial<Record<Code, string>> = {
  [Code.Unauthenticated]: BY_REASON["ERROR_REASON_UNAUTHENTICATED"]!({}),
  [Code.PermissionDenied]: "You are not allowed to do that.",
  [Code.Unavailable]: "The memory service cannot be reached right now. Try again in a moment.",
  [Code.DeadlineExceeded]: "The memory service took too long to answer. Try again.",
  [Code.ResourceExhausted]: "The memory service is busy or the request was too large. Try again later.",
  [Code.Unimplemented]: "This server does not offer that yet.",
};

function fmt(value: string | undefined): string {
  const n = Number(value);
  return value !== undefined && Number.isFinite(n) ? n.toLocaleString("en-US") : "?";
}

/** The contract reason of a failed call ("" when it carries none). */
export function reasonOf(error: unknown): string {
  const info: ErrorInfo | undefined = ConnectError.from(error).findDetails(ErrorInfoSchema)[0];
  return info?.reason ?? "";
}

/** The sentence for a failed call. */
export function describe(error: unknown): string {
  const connectError = ConnectError.from(error);
  const info = connectError.findDetails(ErrorInfoSchema)[0];
  const wording = info ? BY_REASON[info.reason] : undefined;
  if (info && wording) {
    return wording(info.metadata);
  }
  return BY_CODE[connectError.code] ?? "Something went wrong. Nothing was changed; try again.";
}
