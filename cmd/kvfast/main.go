// Command kvfast is the KV-cache-aware router and its companion tools. Each
// subcommand lives in its own file and registers itself in init.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kvfast/kvfast/internal/redact"
)

// subcommand is one verb of the kvfast command line.
type subcommand struct {
	summary string
	run     func(args []string) int // returns the process exit code
}

var subcommands = map[string]subcommand{}

func register(name, summary string, run func(args []string) int) {
	if _, dup := subcommands[name]; dup {
		panic("BUG: subcommand registered twice: " + name)
	}
	subcommands[name] = subcommand{summary: summary, run: run}
}

// usage lists the commands on w: standard output when asked for, standard
// error after a mistake.
func usage(w io.Writer) {
	var b strings.Builder
	b.WriteString("kvfast: a KV-cache-aware LLM router for one multi-GPU node.\n\n")
	b.WriteString("Usage: kvfast <command> [flags]\n\nCommands:\n")
	names := make([]string, 0, len(subcommands))
	for n := range subcommands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "  %-10s %s\n", n, subcommands[n].summary)
	}
	b.WriteString("\nRun 'kvfast <command> --help' (or 'kvfast help <command>') for the flags of one command.\n")
	fmt.Fprint(w, b.String())
}

// helpOutput is where --help writes, nil for the command's own error
// writer. main sets standard output, so that "kvfast serve --help | less"
// shows the help; the tests read it from the writer they give.
var helpOutput io.Writer

func main() {
	helpOutput = os.Stdout
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	name := os.Args[1]
	switch name {
	case "-h", "--help":
		usage(os.Stdout)
		return
	case "--version", "-version":
		printVersion(os.Stdout)
		return
	case "help":
		// "kvfast help serve" is "kvfast serve --help".
		if len(os.Args) < 3 {
			usage(os.Stdout)
			return
		}
		if cmd, ok := subcommands[os.Args[2]]; ok {
			os.Exit(cmd.run([]string{"--help"}))
		}
		if os.Args[2] == "help" {
			usage(os.Stdout)
			return
		}
		fmt.Fprintf(os.Stderr, "kvfast: unknown command %q\n\n", os.Args[2])
		usage(os.Stderr)
		os.Exit(2)
	}
	cmd, ok := subcommands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "kvfast: unknown command %q\n\n", name)
		usage(os.Stderr)
		os.Exit(2)
	}
	os.Exit(cmd.run(os.Args[2:]))
}

// printUsage writes a command's help: its description, then every flag
// in the --flag form the descriptions use, with its default.
// parseFlags parses args into fs. --help prints about and the flags; a
// bad flag prints the error and how to list the flags, not the list
// itself (200 lines for serve, which scrolled the error off the screen).
// It returns fs.Parse's error (flag.ErrHelp for --help).
func parseFlags(fs *flag.FlagSet, args []string, about string) error {
	fs.Usage = func() {} // flag calls it for both; told apart below
	// The flag package prints its errors with one dash ("flag provided but
	// not defined: -bogus"); the help and the docs spell flags with two.
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		msg := err.Error()
		switch {
		case strings.HasPrefix(msg, "flag provided but not defined: -"), strings.HasPrefix(msg, "flag needs an argument: -"):
			msg = strings.Replace(msg, ": -", ": --", 1)
		case strings.HasPrefix(msg, "invalid boolean value "):
			msg = strings.Replace(msg, " for -", " for --", 1) + " (want true or false)"
		case strings.HasPrefix(msg, "invalid value "):
			msg = valueErrorMessage(fs, msg)
		}
		fmt.Fprintln(out, redactCredentials(msg))
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		w := helpOutput
		if w == nil {
			w = fs.Output()
		}
		printUsage(w, fs, about)
	case err != nil:
		fmt.Fprintf(fs.Output(), "run 'kvfast %s --help' for the flags and what they do\n", fs.Name())
	}
	return err
}

func printUsage(w io.Writer, fs *flag.FlagSet, about string) {
	var b strings.Builder
	b.WriteString(about)
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(&b, "  --%s", f.Name)
		if name != "" {
			fmt.Fprintf(&b, " %s", name)
		}
		fmt.Fprintf(&b, "\n        %s", usage)
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" && f.DefValue != "0s" {
			fmt.Fprintf(&b, " (default %s)", f.DefValue)
		}
		b.WriteByte('\n')
	})
	_, _ = io.WriteString(w, b.String())
}

// valueErrorMessage rewrites the flag package's message for a value that
// did not parse, `invalid value "V" for flag -name: why`: the flag with
// two dashes, as the help spells it; the value left out when the flag
// takes free text (a URL, a list of key=value pairs, a path, any of which
// may hold a credential that no pattern can be trusted to find; the error
// after it says what is wrong, naming the item or redacting the URL at
// fault), kept for a number, a duration or a boolean, which hold no
// secret; and what the flag's type takes. The quoted value is skipped as
// Go quoted it, so that text in it that looks like the rest of the
// message cannot be taken for it.
func valueErrorMessage(fs *flag.FlagSet, msg string) string {
	quoted, err := strconv.QuotedPrefix(strings.TrimPrefix(msg, "invalid value "))
	if err != nil {
		return "invalid value for a flag (the message could not be read)"
	}
	rest, ok := strings.CutPrefix(msg[len("invalid value ")+len(quoted):], " for flag -")
	if !ok {
		return "invalid value for a flag (the message could not be read)"
	}
	name, _, _ := strings.Cut(rest, ":")
	f := fs.Lookup(name)
	if f == nil || typeHint(f) == "" {
		return "invalid value for flag --" + rest
	}
	return "invalid value " + quoted + " for flag --" + rest + typeHint(f)
}

// typeHint says what f's type takes, or "" for a type of its own (whose
// error says why).
func typeHint(f *flag.Flag) string {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return ""
	}
	switch g.Get().(type) {
	case time.Duration:
		return " (want a duration with its unit, such as 500ms, 30s, 2m or 1h30m)"
	case int, int64, uint, uint64:
		return " (want a whole number)"
	case float64:
		return " (want a number)"
	case bool:
		return " (want true or false)"
	}
	return ""
}

// extraArgument is the error for an argument left after the flags,
// which kvfast's commands take none of. A boolean flag takes its value
// only after '=': "--flag false" sets it and leaves "false" behind.
func extraArgument(fs *flag.FlagSet) string {
	// A stray argument may be a URL meant for a flag, credentials and all.
	msg := fmt.Sprintf("unexpected argument %q", redact.Endpoint(fs.Arg(0)))
	if a := fs.Arg(0); a == "true" || a == "false" {
		msg += " (a true/false flag takes its value after '=', as in --flag=" + a + ")"
	}
	return msg
}

// urlUserinfo and urlQuery find the secrets a URL in a flag's value may
// carry: user:password@ after its scheme (up to the last @ before a
// space, as a URL parser splits it, whatever the password holds), and a
// query (?api_key=...) or fragment, up to a space or the closing quote of
// a %q-quoted value (escaped quotes inside are taken), and not a colon
// that ends it (the message's own). secretPair finds a key=value whose key
// names a secret, as in a --worker value with an api_key= the router does
// not take. They may take more of the message than the secret: better
// than leaving part of a password.
var (
	urlToken    = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://\S*`)
	urlUserinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)\S*@`)
	urlQuery    = regexp.MustCompile(`(://[^\s?#"\\]*)([?#])(?:[^\s"\\]|\\.)*(?:[^\s"\\:]|\\.)`)
	secretPair  = regexp.MustCompile(`(?i)\b((?:api[_-]?key|token|password|passwd|secret|auth[a-z_]*)=)(?:[^\s,"\\]|\\.)*`)
)

// redactCredentials replaces the credentials, queries and fragments of
// the URLs in a message about a flag's value, and the values of keys that
// name secrets: the flag package quotes the value whole, and the message
// goes to stderr, and so to the journal.
func redactCredentials(msg string) string {
	// A '?' or '#' before a URL's last '@' is a password holding one or a
	// query holding an '@', which no rule can tell apart: the whole
	// token after the scheme goes.
	msg = urlToken.ReplaceAllStringFunc(msg, func(tok string) string {
		i := strings.Index(tok, "://") + len("://")
		if at := strings.LastIndexByte(tok, '@'); at > i {
			if q := strings.IndexAny(tok[i:], "?#"); q >= 0 && i+q < at {
				return tok[:i] + "REDACTED"
			}
		}
		return tok
	})
	msg = urlUserinfo.ReplaceAllString(msg, "${1}REDACTED@")
	msg = urlQuery.ReplaceAllString(msg, "${1}${2}REDACTED")
	return secretPair.ReplaceAllString(msg, "${1}REDACTED")
}
