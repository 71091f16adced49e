// Package redact makes an endpoint, URL or address from configuration or
// from an engine's registration safe to show in a log line or an error:
// whatever may be a credential is replaced.
//
// It is deliberately blunt. An endpoint whose credentials the router
// refuses anyway is shown only so that an operator can tell which one is
// meant, so taking too much (a query that held no key, the part of a
// password before a comma) costs nothing, and taking too little leaks a
// secret into the journal.
package redact

import (
	"net/url"
	"strings"
)

// Endpoint returns endpoint with every part that may hold a credential
// replaced by REDACTED: a URL's user:password@ (with a scheme or without
// one, where the parser sees an opaque URL and no userinfo), its query
// and its fragment; in text no URL parser accepts, everything from the
// first '?' or '#', and everything before the last '@'.
func Endpoint(endpoint string) string {
	if u, err := url.Parse(endpoint); err == nil {
		if u.User != nil {
			u.User = url.User("REDACTED")
		}
		if u.RawQuery != "" || u.ForceQuery {
			u.RawQuery, u.ForceQuery = "REDACTED", false
		}
		u.Fragment, u.RawFragment = "", ""
		endpoint = u.String()
	} else if i := strings.IndexAny(endpoint, "?#"); i >= 0 {
		endpoint = endpoint[:i] + "?REDACTED"
	}
	// A scheme-less user:password@host is an opaque URL: the parser found
	// no userinfo, and the password is still there.
	if i := strings.LastIndexByte(endpoint, '@'); i >= 0 && !strings.HasSuffix(endpoint[:i], "REDACTED") {
		endpoint = "REDACTED@" + endpoint[i+1:]
	}
	return endpoint
}
