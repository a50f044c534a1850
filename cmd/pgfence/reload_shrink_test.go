package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A config file with no keys (one caught while it is written reads so) is
// refused, at start and at a reload, rather than read as all defaults,
// which would drop every guard it names (red team 6b).
func TestEmptyConfigFileRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pgfence.yaml")
	for _, text := range []string{"", "\n  \n", "# just a comment\n"} {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := rereadOptions(map[string][]string{"config": {path}})
		if err == nil || !strings.Contains(err.Error(), "has no keys") {
			t.Errorf("config file %q: %v, want it refused for having no keys", text, err)
		}
	}
	if err := os.WriteFile(path, []byte("guard: [accounts]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if o, err := rereadOptions(map[string][]string{"config": {path}}); err != nil || len(o.guards) != 1 {
		t.Errorf("a config file with a key: %v, guards %v", err, o.guards)
	}
}

// A reload that guards less than before says so: the --guard entries it no
// longer names, and discovery turned off or pointed at another column.
func TestReloadWarnsWhenGuardsShrink(t *testing.T) {
	for _, c := range []struct {
		name     string
		was, now serveOptions
		want     []string // in the log; none for no warning
	}{
		{"same", serveOptions{discover: true, discoverColumn: "fence_epoch", policyOptions: policyOptions{guards: []string{"a", "b"}}},
			serveOptions{discover: true, discoverColumn: "fence_epoch", policyOptions: policyOptions{guards: []string{"b", "a", "c"}}}, nil},
		{"a guard dropped", serveOptions{policyOptions: policyOptions{guards: []string{"a", "b"}}},
			serveOptions{policyOptions: policyOptions{guards: []string{"a"}}}, []string{"no_longer_guarded=b"}},
		{"discovery off", serveOptions{discover: true, discoverColumn: "fence_epoch"},
			serveOptions{discoverColumn: "fence_epoch"}, []string{"turns discovery off", "discover=false"}},
		{"another column", serveOptions{discover: true, discoverColumn: "fence_epoch"},
			serveOptions{discover: true, discoverColumn: "version"}, []string{"discover_column=version"}},
	} {
		var buf bytes.Buffer
		warnShrunk(slog.New(slog.NewTextHandler(&buf, nil)), c.was, c.now)
		if len(c.want) == 0 && buf.Len() > 0 {
			t.Errorf("%s: warned %q", c.name, buf.String())
		}
		for _, w := range c.want {
			if !strings.Contains(buf.String(), w) {
				t.Errorf("%s: log %q, want %q in it", c.name, buf.String(), w)
			}
		}
	}
}

// A reload runs on a goroutine of its own: asking for one never waits for
// one under way, and those asked for meanwhile fold into one more, with
// the newest options.
func TestReloaderDoesNotBlock(t *testing.T) {
	release := make(chan struct{})
	started := make(chan string, 10)
	var ran []string
	r := startReloader(func(o serveOptions) {
		started <- o.mode
		ran = append(ran, o.mode)
		if o.mode == "first" {
			<-release
		}
	})
	r.request(serveOptions{policyOptions: policyOptions{mode: "first"}})
	<-started // the first is under way, and blocked
	asked := make(chan struct{})
	go func() {
		r.request(serveOptions{policyOptions: policyOptions{mode: "second"}})
		r.request(serveOptions{policyOptions: policyOptions{mode: "third"}})
		close(asked)
	}()
	select {
	case <-asked:
	case <-time.After(10 * time.Second):
		t.Fatal("asking for a reload waited for the one under way")
	}
	close(release)
	<-started
	r.stop()
	<-r.done
	if got := strings.Join(ran, ","); got != "first,third" {
		t.Fatalf("reloads ran %s, want first,third", got)
	}
}
