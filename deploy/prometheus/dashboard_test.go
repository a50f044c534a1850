package prometheus_test

import (
	"encoding/json"
	"net/url"
	"os"
	"strings"
	"testing"
)

// checkDashboard runs every query of the Grafana dashboard
// (deploy/grafana/pgfence-dashboard.json) against prom, which scrapes a real
// pgfence and an application exporting the lease metrics: each must parse
// and return a series, so a misspelt or missing metric name fails.
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
			if len(data.Result) == 0 {
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
