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
