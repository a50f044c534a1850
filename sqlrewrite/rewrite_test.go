package sqlrewrite

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the expected parts of testdata/rewrite cases")

const caseDir = "../testdata/rewrite"

// rewriteCase is one file in testdata/rewrite; see testdata/rewrite/README.md.
type rewriteCase struct {
	path       string
	header     []string // comment and header lines, kept for -update
	guards     []string
	rollouts   [][2]string // table ("" for all) and rollout
	missing    []string    // tables that allow a missing token ("all" for all)
	allow      Allow
	setting    string
	mode       Mode
	session    fakeSession // nil: Rewrite gets no Session
	expect     string      // "unchanged", "rewritten", "refused" or "config-error"
	code       string      // SQLSTATE when refused
	statements int         // statements in the output; -1 if not given
	results    []string    // fenced:, probes:, remember: and session-dependent: lines
	input      string
	output     string // with {{TOK table}}, {{TOKA table}}, {{TOKL}}, {{TOKC table}}, {{GATE table}}, {{DTOKL domain}}, {{CLAIM domain}} and {{PROBE table...}} placeholders
	refusal    string // message and hint lines
	configErr  string // New's error, for config-error cases
}

// fakeSession maps PREPAREd names to the guarded tables they write.
type fakeSession map[string][]string

func (f fakeSession) PreparedWrite(name string) []string { return f[name] }

// resultKeys are the header lines that -update regenerates.
var resultKeys = []string{"statements", "fenced", "probes", "remember", "session-dependent"}

func loadCase(path string) (*rewriteCase, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c := &rewriteCase{path: path, setting: "fence.token", statements: -1}
	sections := map[string]*string{"input": &c.input, "output": &c.output, "refusal": &c.refusal, "error": &c.configErr}
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
	case "rollout":
		f := strings.Fields(val)
		switch len(f) {
		case 1:
			c.rollouts = append(c.rollouts, [2]string{"", f[0]})
		case 2:
			c.rollouts = append(c.rollouts, [2]string{f[0], f[1]})
		default:
			return fmt.Errorf("rollout %q is not [TABLE] ROLLOUT", val)
		}
	case "allow-missing":
		c.missing = append(c.missing, val)
	case "allow":
		for _, f := range strings.Fields(val) {
			switch f {
			case "truncate":
				c.allow.Truncate = true
			case "copy-from":
				c.allow.CopyFrom = true
			case "current-of":
				c.allow.CurrentOf = true
			default:
				return fmt.Errorf("allow %q is not truncate, copy-from or current-of", f)
			}
		}
	case "prepared":
		f := strings.Fields(val)
		if c.session == nil {
			c.session = fakeSession{}
		}
		if len(f) > 0 {
			c.session[f[0]] = f[1:]
		}
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
	case "fenced", "probes", "remember", "session-dependent":
		c.results = append(c.results, key+": "+val)
	default:
		return fmt.Errorf("unknown header %q", key)
	}
	return nil
}

func parseRollout(s string) (Rollout, error) {
	for _, r := range []Rollout{Enforce, Shadow, Observe} {
		if r.String() == s {
			return r, nil
		}
	}
	return 0, fmt.Errorf("rollout %q is not enforce, shadow or observe", s)
}

func (c *rewriteCase) rewriter() (*Rewriter, error) {
	cfg := Config{TokenSetting: c.setting, Allow: c.allow}
	for _, spec := range c.guards {
		// "SPEC domain=NAME" puts the guard in a lock domain.
		domain := ""
		if i := strings.LastIndex(spec, " domain="); i >= 0 {
			spec, domain = spec[:i], spec[i+len(" domain="):]
		}
		g, err := ParseGuard(spec)
		if err != nil {
			return nil, err
		}
		g.Domain = domain
		for _, ro := range c.rollouts {
			if ro[0] == "" || ro[0] == g.Name() {
				if g.Rollout, err = parseRollout(ro[1]); err != nil {
					return nil, err
				}
			}
		}
		g.AllowMissingToken = slices.Contains(c.missing, "all") || slices.Contains(c.missing, g.Name())
		cfg.Guards = append(cfg.Guards, g)
	}
	return New(cfg)
}

func (c *rewriteCase) sessionOrNil() Session {
	if c.session == nil {
		return nil
	}
	return c.session
}

// placeholders maps the long generated fragments in res to the readable
// stand-ins used in expected outputs.
func placeholders(r *Rewriter, res *Result) *strings.Replacer {
	var pairs [][2]string
	for _, g := range r.guards {
		strict, allowMissing, lenient := tokenExprs(r.setting, g.name, g.Domain)
		// TOKL names no table (it never raises), so it has no table either;
		// in a lock domain it reads the domain's setting first: DTOKL.
		tokl := "{{TOKL}}"
		if g.Domain != "" {
			tokl = "{{DTOKL " + g.Domain + "}}"
		}
		pairs = append(pairs, [2]string{strict, "{{TOK " + g.name + "}}"},
			[2]string{allowMissing, "{{TOKA " + g.name + "}}"}, [2]string{lenient, tokl})
		// TOKC is the same for every table of a lock domain (or of none): it
		// is written with the first such guard's name (see write).
		cast, gate := strictCheck(r.setting, g.name, g.Domain)
		pairs = append(pairs, [2]string{cast, "{{TOKC " + g.name + "}}"}, [2]string{gate, "{{GATE " + g.name + "}}"})
	}
	for _, d := range r.domains {
		pairs = append(pairs, [2]string{claimToken(r.setting, d.name), "{{CLAIM " + d.name + "}}"})
	}
	for _, p := range res.Probes {
		var names []string
		for _, t := range p.Tables {
			names = append(names, t.Table)
		}
		pairs = append(pairs, [2]string{p.SQL, "{{PROBE " + strings.Join(names, " ") + "}}"})
	}
	// Longest first, so that no fragment is replaced inside a longer one.
	slices.SortStableFunc(pairs, func(a, b [2]string) int { return len(b[0]) - len(a[0]) })
	var flat []string
	for _, p := range pairs {
		flat = append(flat, p[0], p[1])
	}
	return strings.NewReplacer(flat...)
}

// expand replaces the stand-ins in an expected output.
func expand(r *Rewriter, s string) (string, error) {
	var b strings.Builder
	for {
		i := strings.Index(s, "{{")
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		j := strings.Index(s[i:], "}}")
		if j < 0 {
			return "", fmt.Errorf("unterminated placeholder in %q", s[i:])
		}
		b.WriteString(s[:i])
		kind, names, _ := strings.Cut(s[i+2:i+j], " ")
		s = s[i+j+2:]
		// A lock domain's placeholders name the domain.
		switch kind {
		case "CLAIM":
			b.WriteString(claimToken(r.setting, names))
			continue
		case "DTOKL":
			_, _, lenient := tokenExprs(r.setting, "", names)
			b.WriteString(lenient)
			continue
		}
		// The names are guard names separated by spaces; a quoted name may
		// hold spaces itself, so match the longest guard name each time.
		var gs []*guardInfo
		for names != "" {
			var best *guardInfo
			for k := range r.guards {
				g := &r.guards[k]
				if rest, ok := strings.CutPrefix(names, g.name); ok && (rest == "" || rest[0] == ' ') && (best == nil || len(g.name) > len(best.name)) {
					best = g
				}
			}
			if best == nil {
				return "", fmt.Errorf("placeholder names unknown table %q", names)
			}
			gs = append(gs, best)
			names = strings.TrimPrefix(names[len(best.name):], " ")
		}
		if kind == "TOKL" && len(gs) == 0 {
			_, _, lenient := tokenExprs(r.setting, "", "")
			b.WriteString(lenient)
			continue
		}
		if len(gs) == 0 {
			return "", fmt.Errorf("placeholder %q needs a table", kind)
		}
		strict, allowMissing, lenient := tokenExprs(r.setting, gs[0].name, gs[0].Domain)
		cast, gate := strictCheck(r.setting, gs[0].name, gs[0].Domain)
		switch kind {
		case "TOK":
			b.WriteString(strict)
		case "TOKA":
			b.WriteString(allowMissing)
		case "TOKL":
			b.WriteString(lenient)
		case "TOKC":
			b.WriteString(cast)
		case "GATE":
			b.WriteString(gate)
		case "PROBE":
			b.WriteString(r.probeSQL(gs))
		default:
			return "", fmt.Errorf("unknown placeholder %q", kind)
		}
	}
}

// resultLines renders what a case records about a result besides its SQL.
func resultLines(res *Result) []string {
	var out []string
	for _, f := range res.Fenced {
		l := fmt.Sprintf("fenced: %s %s %s", f.Table, f.Kind, f.Rollout)
		if f.Nested {
			l += " nested"
		}
		out = append(out, l)
	}
	for _, p := range res.Probes {
		l := fmt.Sprintf("probes: %d", p.Index)
		for _, t := range p.Tables {
			l += fmt.Sprintf(" %s:%s", t.Table, t.Rollout)
			if t.Domain != "" {
				l += ":" + t.Domain
			}
		}
		out = append(out, l)
	}
	for _, p := range res.Prepared {
		out = append(out, "remember: "+strings.Join(append([]string{p.Name}, p.Tables...), " "))
	}
	if res.SessionDependent {
		out = append(out, "session-dependent: true")
	}
	return out
}

func TestRewriteFiles(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join(caseDir, "*.txt"))
	if err != nil || len(paths) < 160 {
		t.Fatalf("want at least 160 cases in %s, found %d (%v)", caseDir, len(paths), err)
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
	if c.expect == "config-error" {
		c.checkConfigError(t, err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Rewrite(c.input, c.mode, c.sessionOrNil())
	if err != nil {
		t.Fatalf("Rewrite: %v", err)
	}
	if err := verify(r, c.input, c.mode, c.sessionOrNil(), res); err != nil {
		t.Errorf("verify: %v", err)
	}
	if *update {
		c.write(t, r, res)
		return
	}
	switch c.expect {
	case "unchanged":
		if res.SQL != c.input || res.Refusal != nil {
			t.Errorf("want the input unchanged, got %q (refusal %v)", res.SQL, res.Refusal)
		}
	case "rewritten":
		if res.Refusal != nil {
			t.Fatalf("refused: %s (%s)", res.Refusal.Message, res.Refusal.Code)
		}
		want, err := expand(r, c.output)
		if err != nil {
			t.Fatal(err)
		}
		if res.SQL != want {
			t.Errorf("output:\n%s\nwant:\n%s", placeholders(r, res).Replace(res.SQL), c.output)
		}
	case "refused":
		c.checkRefusal(t, res)
	default:
		t.Fatalf("expect %q is not unchanged, rewritten or refused", c.expect)
	}
	if got := resultLines(res); !slices.Equal(got, c.results) {
		t.Errorf("results:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(c.results, "\n"))
	}
	c.checkCount(t, res)
}

// checkConfigError checks that New refused the case's configuration with
// the error section's message.
func (c *rewriteCase) checkConfigError(t *testing.T, err error) {
	if err == nil {
		t.Fatal("New accepted the configuration")
	}
	if *update {
		c.configErr = err.Error()
		c.write(t, nil, nil)
		return
	}
	if c.configErr != "" && err.Error() != c.configErr {
		t.Errorf("New error:\n%s\nwant:\n%s", err, c.configErr)
	}
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

// write regenerates the case file from the result (go test -update); res
// is nil for a config-error case.
func (c *rewriteCase) write(t *testing.T, r *Rewriter, res *Result) {
	var b strings.Builder
	for _, h := range c.header {
		if k, _, _ := strings.Cut(h, ":"); slices.Contains(resultKeys, k) {
			continue
		}
		b.WriteString(h + "\n")
	}
	if res == nil {
		b.WriteString("-- input --\n" + c.input + "\n-- error --\n" + c.configErr + "\n")
	} else {
		if n, err := countStmts(res.SQL); err == nil && res.Refusal == nil {
			fmt.Fprintf(&b, "statements: %d\n", n)
		}
		for _, l := range resultLines(res) {
			b.WriteString(l + "\n")
		}
		b.WriteString("-- input --\n" + c.input + "\n")
		switch {
		case res.Refusal != nil:
			b.WriteString("-- refusal --\n" + res.Refusal.Message + "\n" + res.Refusal.Hint + "\n")
		case c.expect == "rewritten" || res.SQL != c.input:
			// An output that still expands to the result is kept as written:
			// it may name another table with the same {{TOKC T}}.
			out := placeholders(r, res).Replace(res.SQL)
			if want, err := expand(r, c.output); err == nil && want == res.SQL {
				out = c.output
			}
			b.WriteString("-- output --\n" + out + "\n")
		}
	}
	if err := os.WriteFile(c.path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
