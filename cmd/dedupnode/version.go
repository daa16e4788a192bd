package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at link time for releases:
// go build -ldflags "-X main.version=v1.2.3" ./cmd/dedupnode.
var version = ""

// commit may be set at link time too (-X main.commit=...), for builds
// without VCS information (GOFLAGS=-buildvcs=false, a source tarball).
var commit = ""

// versionLine says which build this is: the version (the link-time one,
// else the module version 'go install' recorded, else "devel"), the VCS
// commit (and "dirty" for uncommitted changes) and the Go version, from
// the build information the Go toolchain embeds.
func versionLine() string {
	v, rev, dirty, goVersion := versionString(), commit, false, "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVersion = bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if rev == "" {
					rev = s.Value
				}
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if rev == "" {
		rev = "unknown"
	}
	if dirty {
		rev += " (dirty)"
	}
	return fmt.Sprintf("dedupnode %s, commit %s, %s", v, rev, goVersion)
}

// versionString is the version alone: the link-time one, else the module
// version 'go install' recorded, else "devel".
func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

func newVersionCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go version of this binary",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(e.stdout, versionLine())
			return err
		},
	}
}
