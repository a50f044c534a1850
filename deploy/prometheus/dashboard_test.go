package prometheus_test

import (
	"encoding/json"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfence/pgfence/fence"
)

// onlyWhenWrong are the series pgfence exports only while something is
// wrong (a table it cannot fence, an owner who can switch a backstop off),
// which the scraped pgfence never has: a query of them alone may return
// nothing, if pgfence's metrics describe every name it reads.
var onlyWhenWrong = map[string]bool{
	"pgfence_guarded_table_unfenceable": true,
	"pgfence_backstop_owner_exposed":    true,
}

// metricName finds the metric names of a query's selectors.
var metricName = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\{`)

// checkDashboard runs every query of the Grafana dashboard
// (deploy/grafana/pgfence-dashboard.json) against prom, which scrapes a real
// pgfence and an application exporting the lease metrics: each must parse
// and return a series, so a misspelt or missing metric name fails. A query
// of onlyWhenWrong series alone must parse, and name only metrics pgfence
// describes.
func checkDashboard(t *testing.T, prom *promServer) {
	t.Helper()
	b, err := os.ReadFile("../grafana/pgfence-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Templating struct {
			List []struct {
				Name       string
				Definition string
			}
		}
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("pgfence-dashboard.json: %v", err)
	}
	vars := strings.NewReplacer(`$__rate_interval`, `1m`, `$job`, `pgfence`, `$database`, `.*`)
	n := 0
	for _, p := range d.Panels {
		for _, target := range p.Targets {
			q := vars.Replace(target.Expr)
			var data struct{ Result []json.RawMessage }
			prom.get(t, "/api/v1/query?query="+url.QueryEscape(q), &data)
			if len(data.Result) == 0 && !describedOnlyWhenWrong(t, q) {
				t.Errorf("dashboard panel %q: %s returns nothing: a metric it names does not exist", p.Title, q)
			}
			n++
		}
	}
	if n < 10 {
		t.Fatalf("the dashboard has %d queries; want its panels' queries", n)
	}
	// A variable's label_values(selector, label): the selector must find
	// series with the label.
	for _, v := range d.Templating.List {
		inner, ok := strings.CutPrefix(v.Definition, "label_values(")
		if !ok {
			continue
		}
		i := strings.LastIndex(inner, ",")
		sel, label := vars.Replace(inner[:i]), strings.TrimSpace(strings.TrimSuffix(inner[i+1:], ")"))
		var data struct {
			Result []struct{ Metric map[string]string }
		}
		prom.get(t, "/api/v1/query?query="+url.QueryEscape(sel), &data)
		found := false
		for _, r := range data.Result {
			found = found || r.Metric[label] != ""
		}
		if !found {
			t.Errorf("dashboard variable %s: %s has no series with label %s", v.Name, sel, label)
		}
	}
}

// describedOnlyWhenWrong reports whether every metric q reads is one of
// onlyWhenWrong and is described by pgfence's metrics (fence.NewMetrics),
// which export no series of it until something is wrong.
func describedOnlyWhenWrong(t *testing.T, q string) bool {
	t.Helper()
	names := metricName.FindAllStringSubmatch(q, -1)
	if len(names) == 0 {
		return false
	}
	described := describedMetrics()
	for _, m := range names {
		if !onlyWhenWrong[m[1]] || !described[m[1]] {
			return false
		}
	}
	return true
}

// describedMetrics are the names of the metrics fence.NewMetrics
// registers, series or not.
func describedMetrics() map[string]bool {
	var r recorder
	fence.NewMetrics(&r)
	ch := make(chan *prometheus.Desc)
	go func() {
		for _, c := range r.collectors {
			c.Describe(ch)
		}
		close(ch)
	}()
	names := map[string]bool{}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			names[m[1]] = true
		}
	}
	return names
}

// recorder is a prometheus.Registerer that keeps what is registered.
type recorder struct{ collectors []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	r.collectors = append(r.collectors, cs...)
}

func (r *recorder) Unregister(prometheus.Collector) bool { return false }

// The series that only a fault makes are pgfence's, by these names: a
// rename in fence fails here rather than leaving a dashboard panel that
// shows nothing forever.
func TestOnlyWhenWrongDescribed(t *testing.T) {
	d := describedMetrics()
	if !d["fencing_reject_total"] {
		t.Fatalf("fence.NewMetrics describes %d metrics, not fencing_reject_total: the description was not read", len(d))
	}
	for n := range onlyWhenWrong {
		if !d[n] {
			t.Errorf("fence.NewMetrics does not describe %s", n)
		}
	}
}
