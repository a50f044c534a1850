package main

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// buildVersion is pgfence's version: the one set at build time (-ldflags
// "-X main.version=..."), else the module version the Go toolchain
// recorded (go install github.com/pgfence/pgfence/cmd/pgfence@v1.2.3), else
// the commit a build from a checkout was made from, marked "+dirty" when
// the tree had changes.
func buildVersion() string {
	if version != "dev" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return version
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev == "" {
		return version
	}
	return "dev-" + rev + dirty
}

// buildCommit is the commit pgfence was built from: the one set at build
// time, else the toolchain's record of it, else "unknown".
func buildCommit() string {
	if commit != "" {
		return commit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}

// buildInfo is pgfence_build_info: 1, labelled with what was built.
func buildInfo() prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgfence_build_info",
		Help: "Always 1; its labels say which pgfence runs (version, commit) and with which Go."}, []string{"version", "commit", "goversion"})
	g.WithLabelValues(buildVersion(), buildCommit(), runtime.Version()).Set(1)
	return g
}
