package main

// The rewriter's Go benchmarks (sqlrewrite/bench_test.go,
// fence/bench_test.go), run with -benchmem.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
)

type goBench struct {
	name          string
	nsOp, bOp     float64
	allocsOp      float64
	runs          int
	nsOps, allocs []float64
}

var benchLineRE = regexp.MustCompile(`(?m)^Benchmark(\S+?)(?:-\d+)?\s+\d+\s+([0-9.]+) ns/op\s+([0-9.]+) B/op\s+([0-9.]+) allocs/op`)

// goBenchmarks runs the benchmarks count times each and returns, in order
// of first appearance, the median of each.
func goBenchmarks(goBin string, count int) ([]*goBench, error) {
	var order []*goBench
	byName := map[string]*goBench{}
	for _, pkg := range []struct{ dir, pattern string }{
		{"./sqlrewrite", "^(BenchmarkPrefilterMiss|BenchmarkFullRewrite)$"},
		{"./fence", "^BenchmarkPolicy"},
	} {
		cmd := exec.Command(goBin, "test", "-run", "^$", "-bench", pkg.pattern, "-benchmem",
			"-benchtime", "500ms", "-count", strconv.Itoa(count), pkg.dir)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.Env = os.Environ()
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("go test -bench %s: %v\n%s", pkg.dir, err, out.String())
		}
		for _, m := range benchLineRE.FindAllStringSubmatch(out.String(), -1) {
			b := byName[m[1]]
			if b == nil {
				b = &goBench{name: m[1]}
				byName[m[1]] = b
				order = append(order, b)
			}
			ns, _ := strconv.ParseFloat(m[2], 64)
			bytes, _ := strconv.ParseFloat(m[3], 64)
			allocs, _ := strconv.ParseFloat(m[4], 64)
			b.nsOps = append(b.nsOps, ns)
			b.allocs = append(b.allocs, allocs)
			b.bOp = bytes // B/op and allocs/op do not vary between runs
			b.runs++
		}
	}
	for _, b := range order {
		b.nsOp = medianOf(b.nsOps)
		b.allocsOp = medianOf(b.allocs)
	}
	if len(order) == 0 {
		return nil, fmt.Errorf("no benchmark results")
	}
	return order, nil
}

func medianOf(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
