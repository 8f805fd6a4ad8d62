// Package memoria is Memoria for a Go backend beside the generated stubs
// (memoria/generated/go/memoria/v1): the turn adapter (NewAdapter; adapter.go), a thin layer
// over the server's ModelToolService that gives the model its tools, the memory prompt section
// and the server's words for each tool call, every call naming its turn; and the memory
// block's character count, computed exactly as the server computes it. Its tests call a
// running server (MEMORIA_SERVER, or the older MEMORIA_ADDR).
package memoria

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

const (
	zwnj         = '\u200c'
	zwj          = '\u200d'
	brailleBlank = '\u2800'
)

// lineBreaks turns the line and paragraph separators into the one line ending, after CR LF
// and lone CR (no pattern overlaps another, so the order of these replacements is free).
var lineBreaks = strings.NewReplacer("\r", "\n", "\u2028", "\n", "\u2029", "\n")

// Sanitize returns text as the server stores and shows it: "\n" line endings (CR LF, CR,
// U+2028, U+2029); format (Cf), default-ignorable, control (Cc, but newline and tab) and tag
// block characters removed, except a joiner that real script needs, a braille blank inside
// braille and the first of a run of variation selectors; NFC; outer whitespace stripped. The
// rules and their order are in tests/vectors/README.md.
func Sanitize(text string) string {
	text = lineBreaks.Replace(strings.ReplaceAll(text, "\r\n", "\n"))
	runes := make([]rune, 0, len(text))
	for _, r := range text {
		if !invisible(r) {
			runes = append(runes, r)
		}
	}
	// Each step sees what the one before left, as the server's do.
	runes = dropRuns(runes, func(r rune) bool { return r == brailleBlank }, keepBrailleBlanks)
	runes = dropRuns(runes, func(r rune) bool { return r == zwnj || r == zwj }, keepJoiner)
	runes = cutSelectorRuns(runes)
	// strings.TrimSpace strips what Python's str.strip() does once Cc is gone: they differ
	// only on U+001C..U+001F, which are control characters and already removed.
	return strings.TrimSpace(norm.NFC.String(string(runes)))
}

// CharCount is the number of Unicode code points (runes, not bytes) of Sanitize(text): the
// count the server checks against the limit and reports as char_count.
func CharCount(text string) int {
	return utf8.RuneCountInString(Sanitize(text))
}

// invisible reports the runes removed outright. Cf, Other_Default_Ignorable_Code_Point and
// Variation_Selector together are a superset of Default_Ignorable_Code_Point (Unicode derives
// it from them, minus a few Cf), so with Cf removed anyway this is exactly Cf plus every
// default-ignorable code point.
func invisible(r rune) bool {
	switch {
	case r == '\n' || r == '\t':
		return false
	case r == zwnj || r == zwj || r == brailleBlank || isVariationSelector(r):
		return false // rules of their own
	case r >= 0xE0000 && r <= 0xE007F:
		return true
	default:
		return unicode.In(r, unicode.Cf, unicode.Cc, unicode.Other_Default_Ignorable_Code_Point)
	}
}

// dropRuns removes each maximal run runes[i:j] of runes matching in, unless keep says
// otherwise given the run's place in runes.
func dropRuns(runes []rune, in func(rune) bool, keep func(runes []rune, i, j int) bool) []rune {
	out := runes[:0:0]
	for i := 0; i < len(runes); {
		if !in(runes[i]) {
			out = append(out, runes[i])
			i++
			continue
		}
		j := i
		for j < len(runes) && in(runes[j]) {
			j++
		}
		if keep(runes, i, j) {
			out = append(out, runes[i:j]...)
		}
		i = j
	}
	return out
}

// keepBrailleBlanks keeps blanks between two braille patterns with dots: the space of
// braille text. Elsewhere a blank is only an invisible filler.
func keepBrailleBlanks(runes []rune, i, j int) bool {
	dots := func(r rune) bool { return r > brailleBlank && r <= 0x28FF }
	return i > 0 && j < len(runes) && dots(runes[i-1]) && dots(runes[j])
}

// keepJoiner keeps a single ZWNJ or ZWJ after a letter of an uncased script (Lo: Persian,
// Indic) or a symbol (S: emoji), past the combining marks on it (a virama, VS16), and before
// such a base or a mark. Cased scripts never need one; a run is payload.
func keepJoiner(runes []rune, i, j int) bool {
	base := func(r rune) bool { return unicode.In(r, unicode.Lo, unicode.S) }
	if j-i != 1 || j == len(runes) || !(base(runes[j]) || unicode.Is(unicode.M, runes[j])) {
		return false
	}
	k := i - 1
	for k >= 0 && unicode.Is(unicode.M, runes[k]) {
		k--
	}
	return k >= 0 && base(runes[k])
}

// cutSelectorRuns keeps the first of each run of variation selectors: one picks a glyph
// (emoji, name kanji, Mongolian forms), a run of them is invisible payload.
func cutSelectorRuns(runes []rune) []rune {
	out := runes[:0:0]
	afterSelector := false // the last kept rune was a variation selector
	for _, r := range runes {
		selector := isVariationSelector(r)
		if selector && afterSelector {
			continue
		}
		afterSelector = selector
		out = append(out, r)
	}
	return out
}

func isVariationSelector(r rune) bool {
	return unicode.Is(unicode.Variation_Selector, r)
}
