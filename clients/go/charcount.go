// Package memoriaclient holds what a Go backend needs beside the generated stubs
// (memoria/generated/go/memoria/v1): the memory block's character count, computed exactly as
// the server computes it. Its tests call a running server through the stubs.
package memoriaclient

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Sanitize returns text as the server stores and shows it: "\n" line endings; format (Cf)
// characters, the whole tag block U+E0000-E007F and control (Cc) characters other than newline
// and tab removed; a run of variation selectors cut to its first; NFC; outer whitespace
// stripped. The rules and their order are in tests/vectors/README.md.
func Sanitize(text string) string {
	text = strings.ReplaceAll(text, "\r\n", "\n")
	text = strings.ReplaceAll(text, "\r", "\n")
	var b strings.Builder
	b.Grow(len(text))
	afterSelector := false // the last kept rune was a variation selector
	for _, r := range text {
		if invisible(r) {
			continue // removal comes first, so selectors around a removed rune form one run
		}
		selector := isVariationSelector(r)
		if selector && afterSelector {
			continue
		}
		afterSelector = selector
		b.WriteRune(r)
	}
	// strings.TrimSpace strips what Python's str.strip() does once Cc is gone: they differ
	// only on U+001C..U+001F, which are control characters and already removed.
	return strings.TrimSpace(norm.NFC.String(b.String()))
}

// CharCount is the number of Unicode code points (runes, not bytes) of Sanitize(text): the
// count the server checks against the limit and reports as char_count.
func CharCount(text string) int {
	return utf8.RuneCountInString(Sanitize(text))
}

func invisible(r rune) bool {
	switch {
	case r == '\n' || r == '\t':
		return false
	case r >= 0xE0000 && r <= 0xE007F:
		return true
	default:
		return unicode.Is(unicode.Cf, r) || unicode.Is(unicode.Cc, r)
	}
}

func isVariationSelector(r rune) bool {
	return (r >= 0xFE00 && r <= 0xFE0F) || (r >= 0xE0100 && r <= 0xE01EF)
}
