package main

// BENCH_PGFENCE_PROF=1: CPU profiles of pgfence under pgbench, taken from
// the profiling build (bench/pgfence-prof) through /debug/pprof/profile.
// Profiles and `go tool pprof -top` listings go to bench/profiles/.

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

func (r *runner) profile() error {
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	if err := os.MkdirAll(filepath.Join("bench", "profiles"), 0o755); err != nil {
		return err
	}
	bin, err := filepath.Abs(filepath.Join("bench", "profiles", "pgfence-prof"))
	if err != nil {
		return err
	}
	if out, err := exec.Command(goBin, "build", "-o", bin, "./bench/pgfence-prof").CombinedOutput(); err != nil {
		return fmt.Errorf("building bench/pgfence-prof: %v\n%s", err, out)
	}
	r.pgfenceBin = bin
	r.profBuild = true
	if err := r.setup(); err != nil {
		return err
	}
	plain, _, err := r.startPgfence("pgfence-prof", bin)
	if err != nil {
		return err
	}
	guarded, _, err := r.startPgfence("pgfence-prof guarded", bin, "--guard", "pgbench_accounts")
	if err != nil {
		return err
	}
	scenarios := []struct {
		name     string
		t        target
		mode     string
		workload []string
	}{
		{"select-extended", plain, "extended", []string{"-S"}},
		{"select-prepared", plain, "prepared", []string{"-S"}},
		{"select-simple-guarded", guarded, "simple", []string{"-S"}},
		{"writes-prepared", guarded, "prepared", []string{"-f", r.scripts["fenced-pgfence"]}},
		{"writes-simple", guarded, "simple", []string{"-f", r.scripts["fenced-pgfence"]}},
	}
	for _, sc := range scenarios {
		prof := filepath.Join("bench", "profiles", sc.name+".pprof")
		errc := make(chan error, 1)
		var res run
		go func() {
			var err error
			res, err = r.pgbench(sc.t, sc.mode, sc.workload)
			errc <- err
		}()
		time.Sleep(500 * time.Millisecond) // past connection start-up
		secs := max(r.seconds-1, 1)
		if err := fetch(fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", strings.TrimSuffix(sc.t.metrics, "/metrics"), secs), prof); err != nil {
			return err
		}
		if err := <-errc; err != nil {
			return err
		}
		top, err := exec.Command(goBin, "tool", "pprof", "-top", "-nodecount=30", bin, prof).CombinedOutput()
		if err != nil {
			return fmt.Errorf("go tool pprof: %v\n%s", err, top)
		}
		cum, _ := exec.Command(goBin, "tool", "pprof", "-top", "-cum", "-nodecount=40", bin, prof).CombinedOutput()
		text := fmt.Sprintf("== %s: -M %s through %s: %.0f tps, %.1f µs pgfence CPU/txn\n%s\n-- by cumulative time --\n%s",
			sc.name, sc.mode, sc.t.name, res.tps, res.cpuUs, top, cum)
		os.WriteFile(strings.TrimSuffix(prof, ".pprof")+".txt", []byte(text), 0o644)
		fmt.Println(text)
	}

	// Memory of idle sessions: a heap profile and the goroutine count with
	// r.conns of them open.
	base := strings.TrimSuffix(guarded.metrics, "/metrics")
	heap := filepath.Join("bench", "profiles", "conns-heap.pprof")
	mem, err := holdConns(guarded, r.conns, func() error {
		if err := fetch(base+"/debug/pprof/heap?gc=1", heap); err != nil {
			return err
		}
		return fetch(base+"/debug/pprof/goroutine?debug=1", strings.TrimSuffix(heap, "heap.pprof")+"goroutines.txt")
	})
	if err != nil {
		return err
	}
	top, err := exec.Command(goBin, "tool", "pprof", "-top", "-sample_index=inuse_space", "-nodecount=25", bin, heap).CombinedOutput()
	if err != nil {
		return fmt.Errorf("go tool pprof: %v\n%s", err, top)
	}
	gr, _ := os.ReadFile(strings.TrimSuffix(heap, "heap.pprof") + "goroutines.txt")
	first, _, _ := strings.Cut(string(gr), "\n")
	text := fmt.Sprintf("== %d idle sessions: VmRSS %.1f -> %.1f MiB; %s\n%s", mem.open, mem.before/1024, mem.with/1024, first, top)
	os.WriteFile(strings.TrimSuffix(heap, ".pprof")+".txt", []byte(text), 0o644)
	fmt.Println(text)
	return nil
}

func fetch(url, path string) error {
	resp, err := (&http.Client{Timeout: 5 * time.Minute}).Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s %s", url, resp.Status, b)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}
