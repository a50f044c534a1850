package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/internal/pgserver"
)

const demoTable = "pgfence_demo_ledger"

func demoCmd() *cobra.Command {
	var upstream string
	var pause time.Duration
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show a paused lease holder's write being fenced, then the same run without pgfence",
		Long: `demo starts a throwaway Postgres (unless --upstream is given), puts pgfence in
front of it, and plays the zombie-writer story twice: once through pgfence, where
the stale write changes nothing, and once straight to Postgres, where it lands.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runDemo(ctx, cmd.OutOrStdout(), upstream, pause)
		},
	}
	cmd.Flags().StringVar(&upstream, "upstream", "", "postgres:// URL of a server to use instead of a throwaway one (the demo creates and drops table "+demoTable+")")
	cmd.Flags().DurationVar(&pause, "pause", 600*time.Millisecond, "how long writer A is frozen (its lease lasts half of that)")
	return cmd
}

func runDemo(ctx context.Context, out io.Writer, upstream string, pause time.Duration) error {
	if upstream == "" {
		fmt.Fprintln(out, "Starting a throwaway Postgres...")
		pg, err := pgserver.Start(ctx, pgserver.Options{})
		if err != nil {
			return err
		}
		defer pg.Stop()
		upstream = pg.URL("postgres")
	}
	admin, err := pgx.Connect(ctx, upstream)
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", redact(upstream), err)
	}
	defer admin.Close(context.Background())
	defer admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+demoTable)

	inst, err := start(serveOptions{
		listen:        "127.0.0.1:0",
		metricsListen: "127.0.0.1:0",
		upstream:      upstream,
		policyOptions: policyOptions{guards: []string{demoTable}, tokenSetting: "fence.token"},
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	defer inst.Close()
	viaProxy, err := withHost(upstream, inst.Addr())
	if err != nil {
		return err
	}

	fmt.Fprintf(out, "pgfence listening on %s, guarding table %s (epoch column fence_epoch)\n\n", inst.Addr(), demoTable)
	fmt.Fprintln(out, "== Run 1: through pgfence ==")
	if err := demoRun(ctx, out, admin, viaProxy, pause); err != nil {
		return err
	}
	series := fmt.Sprintf(`fencing_reject_total{database=%q,kind="row",mode="enforce",table=%q,via="rewrite"}`, inst.main.name, demoTable)
	rejects, err := scrapeCounter("http://"+inst.MetricsAddr()+"/metrics", series)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "metrics: %s %s\n\n", series, rejects)

	fmt.Fprintln(out, "== Run 2: the same, straight to Postgres (no pgfence) ==")
	if err := demoRun(ctx, out, admin, upstream, pause); err != nil {
		return err
	}
	fmt.Fprintln(out, "\nWithout the fence, the paused writer's stale write overwrote the newer holder's.")
	return nil
}

// lockService stands in for etcd or ZooKeeper: each grant carries a token
// one higher than the last.
type lockService struct {
	token   int64
	holder  string
	expires time.Time
}

func (l *lockService) grant(who string, ttl time.Duration) int64 {
	l.token++
	l.holder, l.expires = who, time.Now().Add(ttl)
	return l.token
}

// demoRun plays the story once against dbURL and prints what happens.
func demoRun(ctx context.Context, out io.Writer, admin *pgx.Conn, dbURL string, pause time.Duration) error {
	if _, err := admin.Exec(ctx, "DROP TABLE IF EXISTS "+demoTable+"; CREATE TABLE "+demoTable+
		" (id int PRIMARY KEY, owner text NOT NULL, fence_epoch bigint NOT NULL DEFAULT 0); INSERT INTO "+demoTable+" VALUES (1, 'nobody', 0)"); err != nil {
		return err
	}
	t0 := time.Now()
	say := func(format string, args ...any) {
		fmt.Fprintf(out, "[%5dms] %s\n", time.Since(t0).Milliseconds(), fmt.Sprintf(format, args...))
	}
	connect := func(name string) (*pgx.Conn, error) {
		cfg, err := pgx.ParseConfig(dbURL)
		if err != nil {
			return nil, err
		}
		cfg.RuntimeParams["application_name"] = "demo-writer-" + name
		return pgx.ConnectConfig(ctx, cfg)
	}
	a, err := connect("A")
	if err != nil {
		return err
	}
	defer a.Close(context.Background())
	b, err := connect("B")
	if err != nil {
		return err
	}
	defer b.Close(context.Background())

	var locks lockService
	ttl := pause / 2
	tokA := locks.grant("A", ttl)
	say("lock service grants writer A the lease: fencing token %d, lease %v", tokA, ttl)
	if _, err := a.Exec(ctx, fmt.Sprintf("SET fence.token = '%d'", tokA)); err != nil {
		return err
	}
	var seen string
	if err := a.QueryRow(ctx, "SELECT owner FROM "+demoTable+" WHERE id = 1").Scan(&seen); err != nil {
		return err
	}
	say("writer A: SET fence.token = '%d'; reads row 1 (owner=%s) and computes its update", tokA, seen)
	say("writer A freezes (stop-the-world GC, VM pause) for %v", pause)
	frozen := time.Now()

	time.Sleep(ttl + ttl/10)
	say("writer A's lease has expired; A does not know")
	tokB := locks.grant("B", ttl)
	say("lock service grants writer B the lease: fencing token %d", tokB)
	if _, err := b.Exec(ctx, fmt.Sprintf("SET fence.token = '%d'", tokB)); err != nil {
		return err
	}
	tag, err := b.Exec(ctx, "UPDATE "+demoTable+" SET owner = 'B' WHERE id = 1")
	if err != nil {
		return err
	}
	say("writer B: UPDATE %s SET owner = 'B' WHERE id = 1  ->  %s", demoTable, tag)

	time.Sleep(pause - time.Since(frozen))
	say("writer A wakes up, still believing it holds the lease, and writes")
	tag, err = a.Exec(ctx, "UPDATE "+demoTable+" SET owner = 'A' WHERE id = 1")
	if err != nil {
		return err
	}
	say("writer A: UPDATE %s SET owner = 'A' WHERE id = 1  ->  %s", demoTable, tag)

	var owner string
	var epoch int64
	if err := admin.QueryRow(ctx, "SELECT owner, fence_epoch FROM "+demoTable+" WHERE id = 1").Scan(&owner, &epoch); err != nil {
		return err
	}
	verdict := "the newer holder's write stands"
	if owner != "B" {
		verdict = "LOST UPDATE: the stale holder overwrote the newer one"
	}
	fmt.Fprintf(out, "final row: id=1 owner=%s fence_epoch=%d  (%s)\n", owner, epoch, verdict)
	return nil
}

// withHost returns dbURL pointed at hostport instead.
func withHost(dbURL, hostport string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("--upstream must be a postgres:// URL for the demo, got %q", redact(dbURL))
	}
	u.Host = hostport
	return u.String(), nil
}

// redact hides a URL's password.
func redact(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			return u.String()
		}
	}
	return s
}

// scrapeCounter reads one series' value from a Prometheus text endpoint.
func scrapeCounter(url, series string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("%s not found at %s", series, url)
}
