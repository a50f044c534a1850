package compat

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestPgbench runs pgbench/update.sql through the proxy in each query
// mode: first with token 5 (every UPDATE lands), then with the stale token
// 4 (every UPDATE is fenced: UPDATE 0, which is no failure to pgbench).
func TestPgbench(t *testing.T) {
	t.Parallel()
	pgbench := requireCommand(t, "pgbench", installHint+" (apt-get install postgresql: Debian ships pgbench with the server)")
	f := newFixture(t, "pgbench") // the script names compat_pgbench
	const clients, perClient = 2, 50
	landed := 0
	for _, mode := range []string{"simple", "extended", "prepared"} {
		t.Run(mode, func(t *testing.T) {
			run := func(token string) {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				cmd := exec.CommandContext(ctx, pgbench, "--no-vacuum", "-M", mode, "-f", "pgbench/update.sql",
					"-D", "token="+token, "-c", strconv.Itoa(clients), "-j", strconv.Itoa(clients), "-t", strconv.Itoa(perClient),
					f.Proxy.URL())
				out, err := cmd.CombinedOutput()
				t.Logf("pgbench -M %s, token %s:\n%s", mode, token, out)
				if err != nil {
					t.Fatalf("pgbench: %v", err)
				}
				want := clients * perClient
				if m := regexp.MustCompile(`number of transactions actually processed: (\d+)/(\d+)`).FindSubmatch(out); m == nil || string(m[1]) != strconv.Itoa(want) || string(m[2]) != strconv.Itoa(want) {
					t.Errorf("want %d/%d transactions processed", want, want)
				}
				if m := regexp.MustCompile(`number of failed transactions: (\d+)`).FindSubmatch(out); m == nil || string(m[1]) != "0" {
					t.Errorf("want 0 failed transactions")
				}
			}
			run("5")
			landed += clients * perClient
			f.expectBumps(t, landed, 5)
			rejects := f.Proxy.Counter(t, "fencing_reject_total", "table="+f.Table)
			run("4") // stale: a newer token (5) wrote every row
			f.expectBumps(t, landed, 5)
			if got := f.Proxy.Counter(t, "fencing_reject_total", "table="+f.Table) - rejects; got != clients*perClient {
				t.Errorf("fencing_reject_total{table=%q} grew by %v during the stale run, want %d", f.Table, got, clients*perClient)
			}
		})
	}
}

// expectBumps checks that the n columns of rows 1..10 add up to sum and
// that every bumped row carries the token epoch.
func (f *fixture) expectBumps(t *testing.T, sum int, epoch int64) {
	t.Helper()
	var got, wrongEpoch int
	err := pgtest.Direct(t).QueryRow(context.Background(), fmt.Sprintf(
		`SELECT sum(n), count(*) FILTER (WHERE n > 0 AND fence_epoch <> $1) FROM %s WHERE id <= 10`, f.Table), epoch).Scan(&got, &wrongEpoch)
	if err != nil {
		t.Fatal(err)
	}
	if got != sum || wrongEpoch != 0 {
		t.Errorf("%s: sum(n) = %d, want %d; %d bumped rows without epoch %d", f.Table, got, sum, wrongEpoch, epoch)
	}
}
