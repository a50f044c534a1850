package sqlrewrite

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the expected output and refusal sections of testdata/rewrite cases")

const caseDir = "../testdata/rewrite"

// rewriteCase is one file in testdata/rewrite; see testdata/rewrite/README.md.
type rewriteCase struct {
	path       string
	header     []string // comment and header lines, kept for -update
	guards     []string
	setting    string
	mode       Mode
	expect     string // "unchanged", "rewritten" or "refused"
	code       string // SQLSTATE when refused
	statements int    // statements in the output; -1 if not given
	fenced     []string
	input      string
	output     string // with {{TOK table}} and {{PROBE}} placeholders
	refusal    string // message and hint lines
}

func loadCase(path string) (*rewriteCase, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c := &rewriteCase{path: path, setting: "fence.token", statements: -1}
	sections := map[string]*string{"input": &c.input, "output": &c.output, "refusal": &c.refusal}
	var cur *string
	for _, line := range strings.SplitAfter(string(data), "\n") {
		trimmed := strings.TrimRight(line, "\n")
		if name, ok := sectionName(trimmed); ok {
			if cur = sections[name]; cur == nil {
				return nil, fmt.Errorf("%s: unknown section %q", path, name)
			}
			continue
		}
		if cur != nil {
			*cur += line
			continue
		}
		c.header = append(c.header, trimmed)
		if err := c.parseHeader(trimmed); err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
	}
	for _, s := range sections { // a section's last newline ends the section
		*s = strings.TrimSuffix(*s, "\n")
	}
	if len(c.guards) == 0 {
		c.guards = []string{"accounts"}
	}
	if c.input == "" || c.expect == "" {
		return nil, fmt.Errorf("%s: needs an expect: line and an input section", path)
	}
	return c, nil
}

func sectionName(line string) (string, bool) {
	if strings.HasPrefix(line, "-- ") && strings.HasSuffix(line, " --") && len(line) > 6 {
		return line[3 : len(line)-3], true
	}
	return "", false
}

func (c *rewriteCase) parseHeader(line string) error {
	if line == "" || strings.HasPrefix(line, "#") {
		return nil
	}
	key, val, ok := strings.Cut(line, ":")
	if !ok {
		return fmt.Errorf("header line %q is not key: value", line)
	}
	val = strings.TrimSpace(val)
	switch key {
	case "guard":
		c.guards = append(c.guards, val)
	case "setting":
		c.setting = val
	case "mode":
		switch val {
		case "simple":
			c.mode = Simple
		case "prepared":
			c.mode = Prepared
		default:
			return fmt.Errorf("mode %q is not simple or prepared", val)
		}
	case "expect":
		c.expect, c.code, _ = strings.Cut(val, " ")
	case "statements":
		n, err := strconv.Atoi(val)
		c.statements = n
		return err
	case "fenced":
		c.fenced = append(c.fenced, val)
	default:
		return fmt.Errorf("unknown header %q", key)
	}
	return nil
}

func (c *rewriteCase) rewriter() (*Rewriter, error) {
	cfg := Config{TokenSetting: c.setting}
	for _, spec := range c.guards {
		g, err := ParseGuard(spec)
		if err != nil {
			return nil, err
		}
		cfg.Guards = append(cfg.Guards, g)
	}
	return New(cfg)
}

// placeholders maps the readable stand-ins used in expected outputs to the
// long generated fragments.
func placeholders(r *Rewriter) *strings.Replacer {
	var pairs []string
	for _, g := range r.guards {
		pairs = append(pairs, g.token, "{{TOK "+g.name+"}}")
	}
	pairs = append(pairs, r.ProbeSQL(), "{{PROBE}}")
	return strings.NewReplacer(pairs...)
}

func expand(r *Rewriter, s string) string {
	var pairs []string
	for _, g := range r.guards {
		pairs = append(pairs, "{{TOK "+g.name+"}}", g.token)
	}
	pairs = append(pairs, "{{PROBE}}", r.ProbeSQL())
	return strings.NewReplacer(pairs...).Replace(s)
}

func TestRewriteFiles(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join(caseDir, "*.txt"))
	if err != nil || len(paths) < 40 {
		t.Fatalf("want at least 40 cases in %s, found %d (%v)", caseDir, len(paths), err)
	}
	for _, path := range paths {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			c, err := loadCase(path)
			if err != nil {
				t.Fatal(err)
			}
			c.run(t)
		})
	}
}

func (c *rewriteCase) run(t *testing.T) {
	r, err := c.rewriter()
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Rewrite(c.input, c.mode)
	if err != nil {
		t.Fatalf("Rewrite: %v", err)
	}
	if err := verify(r, c.input, c.mode, res); err != nil {
		t.Errorf("verify: %v", err)
	}
	if *update {
		c.write(t, r, res)
		return
	}
	switch c.expect {
	case "unchanged":
		if res.SQL != c.input || res.Refusal != nil || len(res.Fenced) > 0 {
			t.Errorf("want the input unchanged, got %q (refusal %v)", res.SQL, res.Refusal)
		}
	case "rewritten":
		if res.Refusal != nil {
			t.Fatalf("refused: %s (%s)", res.Refusal.Message, res.Refusal.Code)
		}
		if want := expand(r, c.output); res.SQL != want {
			t.Errorf("output:\n%s\nwant:\n%s", placeholders(r).Replace(res.SQL), c.output)
		}
		if got := fencedLines(res); strings.Join(got, "\n") != strings.Join(c.fenced, "\n") {
			t.Errorf("fenced: %q, want %q", got, c.fenced)
		}
	case "refused":
		c.checkRefusal(t, res)
	default:
		t.Fatalf("expect %q is not unchanged, rewritten or refused", c.expect)
	}
	c.checkCount(t, res)
}

func (c *rewriteCase) checkRefusal(t *testing.T, res *Result) {
	ref := res.Refusal
	if ref == nil {
		t.Fatalf("not refused; output %q", res.SQL)
	}
	if ref.Code != c.code {
		t.Errorf("code %s, want %s (%s)", ref.Code, c.code, ref.Message)
	}
	if got := ref.Message + "\n" + ref.Hint; c.refusal != "" && got != c.refusal {
		t.Errorf("refusal:\n%s\nwant:\n%s", got, c.refusal)
	}
	// The server reports the refusal statement's marker as 22P02; reading
	// it back must give the same code and message.
	lit := refusalSQL(ref)
	text := lit[strings.Index(lit, "E'")+2 : strings.LastIndex(lit, "'")]
	text = strings.NewReplacer(`''`, `'`, `\\`, `\`).Replace(text)
	back, ok := ParseErrorMarker("22P02", `invalid input syntax for type bigint: "`+text+`"`)
	if !ok || back.Code != ref.Code || back.Message != ref.Message {
		t.Errorf("ParseErrorMarker round trip: %+v, %v", back, ok)
	}
}

func (c *rewriteCase) checkCount(t *testing.T, res *Result) {
	n, err := countStmts(res.SQL)
	switch {
	case c.expect == "refused" && c.code == codeSyntax:
		// The input may not parse; the refusal itself must.
		if err != nil || n != 1 {
			t.Errorf("refusal statement: %d statements, %v", n, err)
		}
	case err != nil && c.expect == "unchanged" && c.statements < 0:
		// Returned as is without parsing (MayTouch said no).
	case err != nil:
		t.Errorf("output does not parse: %v", err)
	case c.statements < 0 && c.expect != "refused":
		t.Errorf("case needs a statements: line (output has %d)", n)
	case c.statements >= 0 && n != c.statements:
		t.Errorf("output has %d statements, want %d", n, c.statements)
	}
}

func fencedLines(res *Result) []string {
	var out []string
	for _, f := range res.Fenced {
		out = append(out, fmt.Sprintf("%s %s %d", f.Table, f.Kind, f.ProbeIndex))
	}
	return out
}

// write regenerates the case file from the result (go test -update).
func (c *rewriteCase) write(t *testing.T, r *Rewriter, res *Result) {
	var b strings.Builder
	for _, h := range c.header {
		if strings.HasPrefix(h, "fenced:") || strings.HasPrefix(h, "statements:") {
			continue
		}
		b.WriteString(h + "\n")
	}
	if n, err := countStmts(res.SQL); err == nil && res.Refusal == nil {
		fmt.Fprintf(&b, "statements: %d\n", n)
	}
	for _, f := range fencedLines(res) {
		b.WriteString("fenced: " + f + "\n")
	}
	b.WriteString("-- input --\n" + c.input + "\n")
	switch {
	case res.Refusal != nil:
		b.WriteString("-- refusal --\n" + res.Refusal.Message + "\n" + res.Refusal.Hint + "\n")
	case c.expect == "rewritten" || res.SQL != c.input:
		b.WriteString("-- output --\n" + placeholders(r).Replace(res.SQL) + "\n")
	}
	if err := os.WriteFile(c.path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
