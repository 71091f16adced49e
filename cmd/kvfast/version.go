package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
)

func init() {
	register("version", "print the build: module version, commit and Go release", runVersion)
}

const versionAbout = `Usage: kvfast version

Prints what the binary was built from: its module version (or the version
an image build stamped), the commit and whether the tree had changes, and
the Go release and platform.

`

func runVersion(args []string) int {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	if err := parseFlags(fs, args, versionAbout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "kvfast version: takes no arguments")
		return 2
	}
	printVersion(os.Stdout)
	return 0
}

// buildVersion is set by the container image's build (-X), whose context
// holds no .git for the toolchain to stamp: git describe of the checkout
// it was built from.
var buildVersion string

// printVersion writes what the binary was built from, as the Go
// toolchain recorded it: a binary built from a checkout carries its
// commit (and whether the tree had changes), one built by go install its
// module version, the container image's the version it was given. An
// operator asked "which kvfast is this?" reads it here (/metrics'
// go_build_info has the module version alone: "(devel)" for a build from
// a checkout or an image).
func printVersion(w io.Writer) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		fmt.Fprintln(w, "kvfast (no build information)")
		return
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	version := bi.Main.Version
	if buildVersion != "" {
		version = buildVersion
	}
	fmt.Fprintf(w, "kvfast %s\n", version)
	if rev := settings["vcs.revision"]; rev != "" {
		dirty := ""
		if settings["vcs.modified"] == "true" {
			dirty = " (with uncommitted changes)"
		}
		fmt.Fprintf(w, "commit %s%s, %s\n", rev, dirty, settings["vcs.time"])
	}
	fmt.Fprintf(w, "built with %s for %s/%s\n", bi.GoVersion, settings["GOOS"], settings["GOARCH"])
}
