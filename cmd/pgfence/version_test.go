package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/internal/pgserver"
)

// envPG13 names a PostgreSQL 13 bin directory (make test-versions sets it
// to the pinned npm build's, scripts/fetch-postgres.sh 13).
const envPG13 = "PGFENCE_PG13_BINDIR"

// On PostgreSQL 13 serve and init refuse to start, naming the version and
// what to do, whatever the flags: before, init failed on the trigger DDL
// with an error that blamed privileges, and serve with --backstop=off
// served a server whose standby it cannot tell (no in_hot_standby).
func TestUnsupportedServer(t *testing.T) {
	dir := os.Getenv(envPG13)
	if dir == "" {
		t.Skipf("needs a PostgreSQL 13 (%s=<bin>; make test-versions fetches one and sets it)", envPG13)
	}
	pg, err := pgserver.Start(context.Background(), pgserver.Options{BinDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	v, err := pg.Version(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if v.Major() != 13 {
		t.Fatalf("%s=%s runs %s, want PostgreSQL 13", envPG13, dir, v)
	}
	refused := func(t *testing.T, what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s on %s: no error", what, v)
		}
		for _, want := range []string{v.String(), "pgfence supports PostgreSQL 14 to 18", "upgrade the server to PostgreSQL 14 or later"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s on %s: %q, want it to say %q", what, v, err, want)
			}
		}
		if strings.Contains(err.Error(), "syntax error") || strings.Contains(err.Error(), "privilege") {
			t.Errorf("%s on %s: %q blames the SQL or privileges", what, v, err)
		}
	}
	for _, o := range []serveOptions{
		{backstop: "install", discover: true},
		{backstop: "off", discover: false}, // no catalog to read: the version is still checked
	} {
		o.upstream, o.listen, o.tokenSetting, o.discoverColumn = pg.URL("postgres"), "127.0.0.1:0", "fence.token", "fence_epoch"
		inst, err := start(o, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err == nil {
			inst.Close()
		}
		refused(t, "serve --backstop="+o.backstop, err)
	}
	out, err := runInit(t, "--upstream", pg.URL("postgres"))
	refused(t, "init", err)
	if strings.Contains(out, "backstop") {
		t.Errorf("init on %s printed %q, want nothing done", v, out)
	}
}
