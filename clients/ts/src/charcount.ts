/**
 * The memory block's character count, computed exactly as the server computes it, for a
 * settings screen that shows "N characters left" while a person types. The server remains the
 * authority (every response carries `char_count` and `char_limit`); this helper only has to
 * agree with it, and tests/vectors/char_count.json (rules in tests/vectors/README.md) proves
 * that it does. The `u` flag on every regex makes it see code points: without it astral
 * characters such as the tags, which are surrogate pairs in UTF-16, would slip through.
 */

// CR, U+2028 LINE SEPARATOR and U+2029 PARAGRAPH SEPARATOR are line breaks (after CR LF).
const LINE_BREAKS = /[\r\u2028\u2029]/gu;

// Every Cf (format) and default-ignorable code point (assigned or not), the whole tag block
// U+E0000-E007F and every Cc (control) code point but LF and TAB; not the joiners, the
// braille blank and the variation selectors, which have rules of their own below.
const INVISIBLE =
  /(?![\u200C\u200D\u2800]|\p{Variation_Selector})(?:\p{Cf}|\p{Default_Ignorable_Code_Point}|[\u{E0000}-\u{E007F}]|(?![\n\t])\p{Cc})/gu;

// A braille blank is kept only between two braille patterns with dots (the space of braille
// text); anywhere else it is an invisible filler.
const STRAY_BRAILLE_BLANKS = /(?<![\u2800-\u28FF])\u2800+|\u2800+(?![\u2800-\u28FF])/gu;

// A ZWNJ or ZWJ is kept only alone, after a letter of an uncased script (Lo: Persian, Indic)
// or a symbol (emoji) with any combining marks on it (a virama, VS16), and before such a base
// or a mark. Cased scripts never need one; runs are payload.
const STRAY_JOINERS =
  /(?<![\p{Lo}\p{S}]\p{M}*)[\u200C\u200D]+|[\u200C\u200D]{2,}|[\u200C\u200D](?![\p{Lo}\p{M}\p{S}])/gu;

// A run of two or more variation selectors keeps only its first: one selector picks a glyph
// (emoji, name kanji, Mongolian forms), a run of them is invisible payload.
const SELECTOR_RUN = /(\p{Variation_Selector})\p{Variation_Selector}+/gu;

/**
 * The text as the server stores and shows it: `\n` line endings, invisible and control
 * characters removed, variation-selector runs cut to one, NFC, outer whitespace stripped.
 */
export function sanitize(text: string): string {
  return text
    .replaceAll("\r\n", "\n")
    .replace(LINE_BREAKS, "\n")
    .replace(INVISIBLE, "")
    .replace(STRAY_BRAILLE_BLANKS, "")
    .replace(STRAY_JOINERS, "")
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
