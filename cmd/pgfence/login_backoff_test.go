package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgserver"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/poll"
	"github.com/pgfence/pgfence/upstream"
)

// With a wrong password for pgfence's own role, Postgres sees pgfence's
// logins further and further apart (after about 1 s, then twice as long
// each time, jittered), however often /readyz and /metrics are asked in
// between: the catalog's retries and the readiness checks take turns. A
// client is told only that pgfence is not ready, to see its log, and the
// SQLSTATE, never pgfence's own login failure (which names its role); the
// log has it. The start-up line does not say "serving" while clients are
// refused; once the password is right (and a SIGHUP retries at once) it
// does.
func TestUpstreamLoginBackoff(t *testing.T) {
	pgtest.Need(t)
	bg := context.Background()
	pgLog := &pgtest.LogBuffer{}
	pg, err := pgserver.Start(bg, pgserver.Options{Password: "right", Log: pgLog,
		Settings: map[string]string{"log_line_prefix": "%n "}}) // Unix time, in ms
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })

	logs := &pgtest.LogBuffer{}
	t.Setenv("PGPASSWORD", "")
	o := serveOptions{listen: "127.0.0.1:0", metricsListen: "127.0.0.1:0", discover: true, discoverColumn: "fence_epoch", backstop: "off",
		upstream:      fmt.Sprintf("postgres://postgres:wrong@%s/postgres?sslmode=disable", pg.Addr()),
		policyOptions: policyOptions{tokenSetting: "fence.token", guards: []string{"accounts"}}}
	inst, err := start(o, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Close() })
	inst.announce()

	// /readyz and /metrics asked for all the while, as a busy kubelet and
	// Prometheus would.
	stop := make(chan struct{})
	var asked sync.WaitGroup
	asked.Add(1)
	go func() {
		defer asked.Done()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			for _, path := range []string{"/readyz", "/metrics"} {
				if resp, err := http.Get("http://" + inst.MetricsAddr() + path); err == nil {
					resp.Body.Close()
				}
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	refusedLogins := func() []time.Time {
		var at []time.Time
		sc := bufio.NewScanner(strings.NewReader(pgLog.String()))
		for sc.Scan() {
			stamp, rest, _ := strings.Cut(sc.Text(), " ")
			if !strings.Contains(rest, `password authentication failed for user "postgres"`) {
				continue
			}
			sec, err := strconv.ParseFloat(stamp, 64)
			if err != nil {
				t.Fatalf("Postgres's log line %q: %v", sc.Text(), err)
			}
			at = append(at, time.UnixMilli(int64(sec*1000)))
		}
		return at
	}
	const tries = 4
	poll.Eventually(t, time.Minute, fmt.Sprintf("%d refused logins of pgfence's", tries), func() bool { return len(refusedLogins()) >= tries })

	// A client meanwhile: refused, told where to look and the SQLSTATE.
	_, err = pgx.Connect(bg, "postgres://postgres:right@"+inst.Addr()+"/postgres?sslmode=disable")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "08004" || !strings.Contains(pe.Message, "not ready: see its log") ||
		!strings.Contains(pe.Message, "SQLSTATE 28P01") || strings.Contains(pe.Message, "password") || strings.Contains(pe.Message, `"postgres"`) {
		t.Fatalf("a client while pgfence's own login is refused: %v; want FATAL 08004 saying pgfence is not ready, to see its log, and SQLSTATE 28P01, and nothing of pgfence's own login", err)
	}
	close(stop)
	asked.Wait()

	at := refusedLogins()
	for k := 1; k < len(at); k++ {
		// The k-th wait is jittered in the upper half of its step.
		step := min(upstream.BackoffBase<<(k-1), upstream.BackoffRefusedCap)
		if gap := at[k].Sub(at[k-1]); gap < step/2-10*time.Millisecond {
			t.Errorf("refused logins %d and %d came %v apart, want at least %v (half of the step %v): Postgres's log:\n%s", k, k+1, gap, step/2, step, pgLog.String())
		}
	}
	log := logs.String()
	for _, want := range []string{`password authentication failed for user \"postgres\"`, "retry_in=", "pgfence started, but refuses clients"} {
		if !strings.Contains(log, want) {
			t.Errorf("pgfence's log lacks %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "pgfence serving") {
		t.Errorf("pgfence said it serves while it refused every client:\n%s", log)
	}

	// The password made right, a SIGHUP reads at once: pgfence serves,
	// and says so.
	admin, err := pgx.Connect(bg, fmt.Sprintf("postgres://postgres:right@%s/postgres?sslmode=disable", pg.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(bg)
	if _, err := admin.Exec(bg, "ALTER ROLE postgres PASSWORD 'wrong'"); err != nil {
		t.Fatal(err)
	}
	inst.reload(bg, inst.options())
	if code, body := readyz(t, inst); code != http.StatusOK {
		t.Fatalf("/readyz once the password is right and pgfence reloaded: %d %q", code, body)
	}
	if !strings.Contains(logs.String(), `msg="pgfence serving"`) || !strings.Contains(logs.String(), "guards=1") {
		t.Fatalf("pgfence serves, and its log does not say so:\n%s", logs.String())
	}
	c, err := pgx.Connect(bg, "postgres://postgres:wrong@"+inst.Addr()+"/postgres?sslmode=disable")
	if err != nil {
		t.Fatalf("a client once pgfence serves: %v", err)
	}
	c.Close(bg)
}
