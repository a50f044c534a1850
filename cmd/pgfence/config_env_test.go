package main

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/spf13/cobra"
)

// PGFENCE_<FLAG> sets a flag: the command line wins over it, and it wins
// over the config file; a bad value names the variable.
func TestEnvConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pgfence.yaml")
	if err := os.WriteFile(file, []byte("upstream: postgres://from-file\nmetrics-listen: 127.0.0.1:1\nmax-client-conns: 7\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PGFENCE_UPSTREAM", "postgres://pgfence:secret@from-env/db")
	t.Setenv("PGFENCE_METRICS_LISTEN", "127.0.0.1:2")
	t.Setenv("PGFENCE_GUARD", "accounts")
	var o serveOptions
	cmd := &cobra.Command{Use: "serve"}
	o.addFlags(cmd)
	if err := cmd.Flags().Parse([]string{"--config", file, "--metrics-listen", "127.0.0.1:3"}); err != nil {
		t.Fatal(err)
	}
	if err := loadEnv(cmd); err != nil {
		t.Fatal(err)
	}
	if err := loadConfigFile(cmd, o.configFile); err != nil {
		t.Fatal(err)
	}
	if o.upstream != "postgres://pgfence:secret@from-env/db" || o.metricsListen != "127.0.0.1:3" || o.maxClientConns != 7 ||
		len(o.guards) != 1 || o.guards[0] != "accounts" {
		t.Fatalf("upstream %q, metrics-listen %q, max-client-conns %d, guards %v; want the environment's, the command line's, the file's, the environment's",
			o.upstream, o.metricsListen, o.maxClientConns, o.guards)
	}
	// List flags take a comma-separated list; a lock domain's name is
	// checked whether or not a guard has it.
	t.Setenv("PGFENCE_DOMAIN", "a=d1,b=d1")
	t.Setenv("PGFENCE_TABLE_MODE", "a=shadow,b=observe")
	t.Setenv("PGFENCE_EXCLUDE_DATABASE", "scratch,reports")
	var o3 serveOptions
	cmd3 := &cobra.Command{Use: "serve"}
	o3.addFlags(cmd3)
	if err := loadEnv(cmd3); err != nil {
		t.Fatal(err)
	}
	if len(o3.domains) != 2 || o3.domains[1] != "b=d1" || len(o3.tableModes) != 2 || o3.tableModes[1] != "b=observe" ||
		len(o3.excludeDatabases) != 2 || o3.excludeDatabases[1] != "reports" {
		t.Fatalf("domains %q, table modes %q, excluded databases %q: want two of each", o3.domains, o3.tableModes, o3.excludeDatabases)
	}
	if _, err := o3.applier(); err != nil {
		t.Fatal(err)
	}
	o3.domains = []string{"a=d1;b"}
	if _, err := o3.applier(); err == nil {
		t.Fatal("a lock domain named d1;b was accepted")
	}
	t.Setenv("PGFENCE_DOMAIN", "")
	t.Setenv("PGFENCE_TABLE_MODE", "")
	t.Setenv("PGFENCE_EXCLUDE_DATABASE", "")

	t.Setenv("PGFENCE_MAX_MESSAGE_SIZE", "lots")
	var o2 serveOptions
	cmd2 := &cobra.Command{Use: "serve"}
	o2.addFlags(cmd2)
	if err := loadEnv(cmd2); err == nil || err.Error()[:len("PGFENCE_MAX_MESSAGE_SIZE")] != "PGFENCE_MAX_MESSAGE_SIZE" {
		t.Fatalf("a bad value in the environment: %v, want an error naming PGFENCE_MAX_MESSAGE_SIZE", err)
	}
}

// pgfence_build_info says which pgfence runs.
func TestBuildInfo(t *testing.T) {
	oldVersion, oldCommit := version, commit
	version, commit = "v9.9.9-test", "0123abc"
	defer func() { version, commit = oldVersion, oldCommit }()
	if got := buildVersion(); got != "v9.9.9-test" {
		t.Fatalf("buildVersion() = %q with -X main.version", got)
	}
	s := newServeTest(t)
	inst := s.serve(serveOptions{backstop: "off"})
	if got := scrape(t, inst, `pgfence_build_info{commit="0123abc",goversion="`+runtime.Version()+`",version="v9.9.9-test"}`); got != "1" {
		t.Fatalf("pgfence_build_info = %q, want 1", got)
	}
}
