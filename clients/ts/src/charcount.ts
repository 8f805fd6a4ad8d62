/**
 * The memory block's character count, computed exactly as the server computes it, for a
 * settings screen that shows "N characters left" while a person types. The server remains the
 * authority (every response carries `char_count` and `char_limit`); this helper only has to
 * agree with it, and tests/vectors/char_count.json (rules in tests/vectors/README.md) proves
 * that it does.
 */

// Every Cf (format) code point, the whole tag block U+E0000-E007F (its unassigned code points
// are as invisible as the tags) and every Cc (control) code point but LF and TAB. The `u` flag
// makes the regex see code points: without it astral Cf characters such as the tags, which
// are surrogate pairs in UTF-16, would slip through.
const INVISIBLE = /\p{Cf}|[\u{E0000}-\u{E007F}]|(?![\n\t])\p{Cc}/gu;

// A run of two or more variation selectors keeps only its first: one selector picks a glyph
// (emoji, name kanji), a run of them is invisible payload.
const SELECTOR_RUN =
  /([\u{FE00}-\u{FE0F}\u{E0100}-\u{E01EF}])[\u{FE00}-\u{FE0F}\u{E0100}-\u{E01EF}]+/gu;

/**
 * The text as the server stores and shows it: `\n` line endings, invisible and control
 * characters removed, variation-selector runs cut to one, NFC, outer whitespace stripped.
 */
export function sanitize(text: string): string {
  return text
    .replaceAll("\r\n", "\n")
    .replaceAll("\r", "\n")
    .replace(INVISIBLE, "")
    .replace(SELECTOR_RUN, "$1")
    .normalize("NFC")
    .trim(); // strips what Python's str.strip() strips, once Cf (U+FEFF) and Cc are gone
}

/**
 * Number of Unicode code points of the sanitized text: the count the server checks against
 * the limit. Not `.length`, which counts UTF-16 code units (an emoji counts 2).
 */
export function charCount(text: string): number {
  return [...sanitize(text)].length; // string iteration yields code points
}
