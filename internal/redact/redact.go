package redact

import (
	"net/url"
	"strings"
)

// Endpoint returns endpoint with every part that may hold a credential
// replaced by REDACTED: everything before the last '@' (after the scheme),
// a URL's query and its fragment, and in text no URL parser accepts,
// everything from the first '?' or '#'.
func Endpoint(endpoint string) string {
	// The userinfo goes first, on the raw text: a password written with an
	// unescaped '?', '#' or '/' ends the authority early for a parser (or
	// for the cut below), which would then keep it. A '@' in a path or
	// query costs the host in the shown text, not a secret.
	scheme, rest := "", endpoint
	if i := strings.Index(endpoint, "://"); i >= 0 {
		scheme, rest = endpoint[:i+len("://")], endpoint[i+len("://"):]
	}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		endpoint = scheme + "REDACTED@" + rest[i+1:]
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
