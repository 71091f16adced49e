package redact

import (
	"net/url"
	"strings"
)

// Endpoint returns endpoint with every part that may hold a credential
// replaced by REDACTED: everything before the last '@' (after the
// scheme), a URL's query and its fragment, and in text no URL parser
// accepts, everything from the first '?' or '#'. When a '?' or '#' comes
// before the last '@' (a password holding one, or a query holding an
// '@': the text cannot say which), nothing after the scheme is shown.
func Endpoint(endpoint string) string {
	// The userinfo goes first, on the raw text: a password written with an
	// unescaped '?', '#' or '/' ends the authority early for a parser (or
	// for the cut below), which would then keep it.
	scheme, rest := "", endpoint
	if i := strings.Index(endpoint, "://"); i > 0 && isScheme(endpoint[:i]) {
		scheme, rest = endpoint[:i+len("://")], endpoint[i+len("://"):]
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		if q := strings.IndexAny(rest, "?#"); q >= 0 && q < at {
			return scheme + "REDACTED"
		}
		endpoint = scheme + "REDACTED@" + rest[at+1:]
	}
	if u, err := url.Parse(endpoint); err == nil {
		if u.RawQuery != "" || u.ForceQuery {
			u.RawQuery, u.ForceQuery = "REDACTED", false
		}
		u.Fragment, u.RawFragment = "", ""
		endpoint = u.String()
	} else if i := strings.IndexAny(endpoint, "?#"); i >= 0 {
		endpoint = endpoint[:i] + "?REDACTED"
	}
	return endpoint
}

// isScheme reports whether s is a URL scheme (RFC 3986: a letter, then
// letters, digits, '+', '-' or '.'), so that a "://" inside a query or a
// password does not pass for the end of one.
func isScheme(s string) bool {
	for i, c := range []byte(s) {
		letter := c|0x20 >= 'a' && c|0x20 <= 'z'
		if !letter && (i == 0 || !(c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return false
		}
	}
	return s != ""
}
