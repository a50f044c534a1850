package prometheus_test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const scrapeFile = "prometheus-scrape.yml"

// The scrape configuration shipped here is one Prometheus takes (promtool
// check config, which also checks the rule file it loads), and its targets
// are on pgfence's default metrics port, as `pgfence serve --help` gives
// it: not postgres_exporter's 9187.
func TestScrapeConfig(t *testing.T) {
	promtool := tool(t, "promtool")
	if out, err := exec.Command(promtool, "check", "config", scrapeFile).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config %s: %v\n%s", scrapeFile, err, out)
	}

	bin := filepath.Join(t.TempDir(), "pgfence")
	if out, err := exec.Command(goTool(), "build", "-o", bin, "github.com/pgfence/pgfence/cmd/pgfence").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/pgfence: %v\n%s", err, out)
	}
	help, err := exec.Command(bin, "serve", "--help").Output()
	if err != nil {
		t.Fatalf("pgfence serve --help: %v", err)
	}
	m := regexp.MustCompile(`--metrics-listen string .*\(default "([^"]+)"\)`).FindSubmatch(help)
	if m == nil {
		t.Fatalf("pgfence serve --help names no default --metrics-listen:\n%s", help)
	}
	_, port, err := net.SplitHostPort(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	if port == "9187" {
		t.Errorf("pgfence's default metrics port is 9187, postgres_exporter's")
	}

	b, err := os.ReadFile(scrapeFile)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	targets := 0
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				targets++
				if _, p, err := net.SplitHostPort(target); err != nil || p != port {
					t.Errorf("%s: job %s scrapes %s, not pgfence's metrics port %s", scrapeFile, sc.JobName, target, port)
				}
			}
		}
	}
	if targets == 0 {
		t.Fatalf("%s: no static target: the check would pass vacuously", scrapeFile)
	}
	if !strings.Contains(string(b), "pgfence-alerts.yml") {
		t.Errorf("%s does not load pgfence-alerts.yml", scrapeFile)
	}
}
